/** `testConfig` YAML with both test keys on one plan named `small`, given as a YAML flow mapping. */
export function withPlan(yaml: string, plan: string): string {
  return yaml
    .replace('big: { capacity: 100000, refill_per_second: 100000 }', `small: ${plan}`)
    .replaceAll('plan: big', 'plan: small');
}
