import type { TestContext } from 'node:test';

const stacks = new WeakMap<TestContext, (() => unknown)[]>();

/**
 * Registers `fn` to run when the test ends, last registered first. node:test runs `t.after`
 * hooks in the order they were added, which stops a Redis or an upstream before the perch that
 * uses it, so perch spends its last moments reconnecting (ioredis' cluster subscriber piles
 * listeners on a dead socket). Helpers that start things use this instead, so whatever started
 * last, usually perch, stops first. Every step runs even if one fails; the first failure is thrown.
 */
export function onCleanup(t: TestContext, fn: () => unknown): void {
  let stack = stacks.get(t);
  if (stack === undefined) {
    const steps: (() => unknown)[] = [];
    stack = steps;
    stacks.set(t, steps);
    t.after(async () => {
      let failure: unknown;
      while (steps.length > 0) {
        try {
          await steps.pop()!();
        } catch (error) {
          failure ??= error;
        }
      }
      if (failure !== undefined) throw failure;
    });
  }
  stack.push(fn);
}
