import { parseCommand } from './cli.js';
import { loadConfigFile } from './config/load.js';
import { heapPlan } from './app/heap-size.js';
import { execWords } from './app/relaunch.js';

/**
 * `bin/perch`'s first step: prints the words it execs main.js with, sized from the configuration
 * (relaunch.ts, `execWords`), or `node` alone when there is nothing to size: another command than
 * serving, a heap the user sized, `PERCH_HEAP_SIZING=off`, or a configuration or command line
 * main.js will refuse, which it then reports, once.
 */
function words(): string[] {
  const command = parseCommand(process.argv.slice(2), process.env);
  if (command.kind !== 'serve') return ['node'];
  let plan;
  try {
    plan = heapPlan(loadConfigFile(command.configPath, process.env), [], process.env);
  } catch {
    return ['node'];
  }
  return plan.kind === 'relaunch' ? execWords(plan.flags, plan.env) : ['node'];
}

process.stdout.write(`${words().join(' ')}\n`);
