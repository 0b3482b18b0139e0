import { parseArgs } from 'node:util';

/** What the command line asked for. */
export type Command =
  | { readonly kind: 'serve'; readonly configPath: string }
  | { readonly kind: 'check'; readonly configPath: string }
  | { readonly kind: 'health_check'; readonly configPath: string }
  | { readonly kind: 'help' }
  | { readonly kind: 'version' }
  | { readonly kind: 'usage_error'; readonly message: string };

export const USAGE = `Usage: perch [--config FILE] [--check-config | --health-check]

  --config FILE     YAML configuration (default: $PERCH_CONFIG)
  --check-config    validate the configuration and read the files it names, print every
                    problem, exit 0 or 2
  --health-check    GET /healthz on the configured listener, exit 0 when it answers 200, else 1
  --version         print perch's version
  --help            show this text`;

/** Parses argv (without node and script); `PERCH_CONFIG` stands in for a missing --config. */
export function parseCommand(argv: readonly string[], env: NodeJS.ProcessEnv): Command {
  let values;
  try {
    ({ values } = parseArgs({
      args: [...argv],
      options: {
        config: { type: 'string' },
        'check-config': { type: 'boolean' },
        'health-check': { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
        version: { type: 'boolean', short: 'v' },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (error) {
    return { kind: 'usage_error', message: (error as Error).message };
  }
  if (values.help === true) return { kind: 'help' };
  if (values.version === true) return { kind: 'version' };
  if (values['check-config'] === true && values['health-check'] === true) {
    return { kind: 'usage_error', message: '--check-config and --health-check exclude each other' };
  }
  const configPath = values.config ?? env.PERCH_CONFIG;
  if (configPath === undefined || configPath === '') {
    return { kind: 'usage_error', message: 'no configuration: pass --config FILE or set PERCH_CONFIG' };
  }
  if (values['health-check'] === true) return { kind: 'health_check', configPath };
  return { kind: values['check-config'] === true ? 'check' : 'serve', configPath };
}
