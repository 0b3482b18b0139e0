import { parseArgs } from 'node:util';

/** What the command line asked for. */
export type Command =
  | { readonly kind: 'serve'; readonly configPath: string }
  | { readonly kind: 'check'; readonly configPath: string }
  | { readonly kind: 'help' }
  | { readonly kind: 'usage_error'; readonly message: string };

export const USAGE = `Usage: perch [--config FILE] [--check-config]

  --config FILE     YAML configuration (default: $PERCH_CONFIG)
  --check-config    validate the configuration, print every problem, exit 0 or 2
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
        help: { type: 'boolean', short: 'h' },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (error) {
    return { kind: 'usage_error', message: (error as Error).message };
  }
  if (values.help === true) return { kind: 'help' };
  const configPath = values.config ?? env.PERCH_CONFIG;
  if (configPath === undefined || configPath === '') {
    return { kind: 'usage_error', message: 'no configuration: pass --config FILE or set PERCH_CONFIG' };
  }
  return { kind: values['check-config'] === true ? 'check' : 'serve', configPath };
}
