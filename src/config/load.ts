import { readFileSync } from 'node:fs';
import { LineCounter, isCollection, isScalar, parseDocument, visit, type Document, type YAMLError } from 'yaml';
import { substituteEnv } from './env-substitution.js';
import type { Config } from './types.js';
import { validateConfig } from './validate.js';

/** Every problem found in a configuration, reported together. */
export class ConfigError extends Error {
  readonly problems: readonly string[];

  constructor(problems: readonly string[], source?: string) {
    const where = source === undefined ? '' : ` in ${source}`;
    super(`invalid configuration${where}:\n${problems.map((problem) => `  ${problem}`).join('\n')}`);
    this.name = 'ConfigError';
    this.problems = Object.freeze([...problems]);
  }
}

/** Parses, substitutes, defaults, validates and deep-freezes a YAML configuration. */
export function parseConfig(yamlText: string, env: NodeJS.ProcessEnv): Config {
  const substituted = substituteEnv(parseYaml(yamlText), env);
  const result = validateConfig(substituted.value);
  if ('config' in result && substituted.problems.length === 0) return deepFreeze(result.config);

  // A value whose substitution failed still holds its `${...}` text; what validation says about
  // it (too short, names no upstream) is noise next to the missing variable.
  const failed = [...substituted.failedPaths].map((path) => `${path}: `);
  const validationProblems =
    'problems' in result ? result.problems.filter((problem) => !failed.some((prefix) => problem.startsWith(prefix))) : [];
  throw new ConfigError([...substituted.problems, ...validationProblems]);
}

export function loadConfigFile(path: string, env: NodeJS.ProcessEnv = process.env): Config {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code ?? 'unknown error';
    throw new ConfigError([`${path}: cannot read the configuration file (${code})`]);
  }
  try {
    return parseConfig(text, env);
  } catch (error) {
    if (error instanceof ConfigError) throw new ConfigError(error.problems, path);
    throw error;
  }
}

/**
 * Syntax errors are reported by position only: the `yaml` package's pretty messages quote the
 * source line, which may hold a literal secret.
 */
function parseYaml(text: string): unknown {
  const lineCounter = new LineCounter();
  const doc = parseDocument(text, { lineCounter, prettyErrors: false });
  if (doc.errors.length > 0) {
    throw new ConfigError(
      doc.errors.map((error) => {
        const { line, col } = lineCounter.linePos(error.pos[0]);
        const opened = unclosedAt(doc, error);
        if (opened === undefined) return `YAML syntax, line ${line}, column ${col}: ${error.message}`;
        const start = lineCounter.linePos(opened);
        return `YAML syntax, line ${start.line}, column ${start.col}: ${error.message} (opened here, still open at line ${line}, column ${col})`;
      }),
    );
  }
  try {
    return doc.toJS();
  } catch (error) {
    // Raised for alias abuse (the "billion laughs" expansion limit) and similar.
    throw new ConfigError([`YAML: ${(error as Error).message}`]);
  }
}

/** The parser's messages for a flow collection or quoted scalar that was never closed. */
const UNCLOSED = /end with a [\]}]|Missing closing/;

/**
 * The parser notices an unclosed `[`, `{` or quote only where the next construct begins, often
 * lines later or at the end of the file; the line to fix is where it was opened: the start of
 * the innermost flow collection or quoted scalar that runs up to the error.
 */
function unclosedAt(doc: Document, error: YAMLError): number | undefined {
  if (!UNCLOSED.test(error.message)) return undefined;
  const at = error.pos[0];
  let start: number | undefined;
  visit(doc, (_key, node) => {
    const open = (isCollection(node) && node.flow === true) || (isScalar(node) && (node.type === 'QUOTE_DOUBLE' || node.type === 'QUOTE_SINGLE'));
    const range = open ? node.range : undefined;
    if (range != null && range[0] < at && range[1] === at && (start === undefined || range[0] > start)) start = range[0];
  });
  return start;
}

function deepFreeze<T>(value: T): T {
  if (typeof value === 'object' && value !== null && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const child of Object.values(value)) deepFreeze(child);
  }
  return value;
}
