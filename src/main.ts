#!/usr/bin/env node
import { nodeVersionProblem } from './node-version.js';
import { primaryLink } from './app/primary-link.js';

// Before anything else is loaded: on an older Node, a module perch imports may fail to link or
// to run, and that error would name a symptom rather than the cause.
const problem = nodeVersionProblem(process.version);
if (problem === undefined) {
  // A worker of `perch --workers` holds its signals from here (app/primary-link.ts), not once
  // the rest of perch has loaded: a SIGHUP to the process group in between would end it.
  primaryLink();
  await import('./command.js');
} else {
  process.stderr.write(`perch: ${problem}\n`);
  process.exitCode = 2;
}
