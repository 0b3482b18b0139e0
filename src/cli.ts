import { availableParallelism } from 'node:os';
import { parseArgs } from 'node:util';

/** What the command line asked for. */
export type Command =
  /** `workers`: perch processes to run on the one port (`--workers`), 1 without the flag. */
  | { readonly kind: 'serve'; readonly configPath: string; readonly workers: number }
  /** `workers`: the `--workers` it is checked for (the ports they take), 1 without the flag. */
  | { readonly kind: 'check'; readonly configPath: string; readonly workers: number }
  | { readonly kind: 'health_check'; readonly configPath: string }
  | { readonly kind: 'help' }
  | { readonly kind: 'version' }
  | { readonly kind: 'usage_error'; readonly message: string };

export const USAGE = `Usage: perch [--config FILE] [--workers N | --check-config | --health-check]

  --config FILE     YAML configuration (default: $PERCH_CONFIG)
  --workers N       serve with N perch processes sharing the port (auto: one per core);
                    they share the cache and the limits through Redis, which this needs
  --check-config    validate the configuration and read the files it names, print every
                    problem, exit 0 or 2; with --workers N, also what N workers need
  --health-check    GET /healthz on the configured listener, exit 0 when it answers 200, else 1
  --version         print perch's version and node's
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
        workers: { type: 'string' },
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
  if (values.workers !== undefined && values['health-check'] === true) {
    return { kind: 'usage_error', message: '--workers goes with serving or --check-config, not with --health-check' };
  }
  if (values['health-check'] === true) return { kind: 'health_check', configPath };
  const workers = values.workers === undefined ? 1 : workerCount(values.workers);
  if (workers === undefined) return { kind: 'usage_error', message: `--workers takes a whole number from 1 to ${MAX_WORKERS} or auto, not ${JSON.stringify(values.workers)}` };
  if (values['check-config'] === true) return { kind: 'check', configPath, workers };
  return { kind: 'serve', configPath, workers };
}

/** More would be a typo: a host with more cores than this is not where one perch spreads. */
const MAX_WORKERS = 1024;

/** `--workers`: a count, or `auto` for every core this process may use. */
function workerCount(text: string): number | undefined {
  if (text === 'auto') return availableParallelism();
  if (!/^[0-9]{1,4}$/.test(text)) return undefined;
  const count = Number(text);
  return count >= 1 && count <= MAX_WORKERS ? count : undefined;
}
