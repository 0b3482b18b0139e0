#!/usr/bin/env node
import { nodeVersionProblem } from './node-version.js';

// Before anything else is loaded: on an older Node, a module perch imports may fail to link or
// to run, and that error would name a symptom rather than the cause.
const problem = nodeVersionProblem(process.version);
if (problem === undefined) await import('./command.js');
else {
  process.stderr.write(`perch: ${problem}\n`);
  process.exitCode = 2;
}
