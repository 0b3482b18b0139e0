import { readFileSync } from 'node:fs';
import { Problems, childPath, indexPath, isMapping } from './schema-helpers.js';

export interface SubstitutionResult {
  /** A copy of the tree with every string value substituted; the input is not modified. */
  readonly value: unknown;
  readonly problems: readonly string[];
  /** Key paths whose substitution failed; later checks on those values would only add noise. */
  readonly failedPaths: ReadonlySet<string>;
}

const REFERENCE = /^([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?$/s;

/** `${file:/path}`: a secret mounted as a file (Docker and Kubernetes secrets). */
const FILE_PREFIX = 'file:';

/**
 * Replaces `${NAME}`, `${NAME:-default}` and `${file:/path}` in every string value of a parsed
 * YAML tree; `$${` stands for a literal `${`. Working on the parsed tree rather than the text means a variable's
 * value is always one string scalar and can never inject YAML structure. Mapping keys are left
 * alone: they are part of the schema, not data.
 */
export function substituteEnv(tree: unknown, env: NodeJS.ProcessEnv): SubstitutionResult {
  const problems = new Problems();
  const failedPaths = new Set<string>();

  const walk = (node: unknown, path: string): unknown => {
    if (typeof node === 'string') {
      const result = substituteString(node, env);
      if (result.errors.length === 0) return result.text;
      for (const error of result.errors) problems.add(path, error);
      failedPaths.add(path);
      return node;
    }
    if (Array.isArray(node)) return node.map((item, i) => walk(item, indexPath(path, i)));
    if (isMapping(node)) {
      return Object.fromEntries(Object.entries(node).map(([key, value]) => [key, walk(value, childPath(path, key))]));
    }
    return node;
  };

  const value = walk(tree, '');
  return { value, problems: problems.list, failedPaths };
}

/**
 * Substituted text is not scanned again, so a value containing `${` stays literal. The messages
 * name the variable or file but never echo the surrounding text or a value: both may be secrets.
 */
function substituteString(text: string, env: NodeJS.ProcessEnv): { text: string; errors: string[] } {
  const errors: string[] = [];
  let out = '';
  let i = 0;
  while (i < text.length) {
    if (text.startsWith('$${', i)) {
      out += '${';
      i += 3;
      continue;
    }
    if (!text.startsWith('${', i)) {
      out += text[i];
      i += 1;
      continue;
    }
    const close = text.indexOf('}', i + 2);
    if (close === -1) {
      errors.push('unterminated "${" (write "$${" for a literal "${")');
      break;
    }
    const reference = text.slice(i + 2, close);
    if (reference.includes('${')) {
      // `${A:-${B}}` would end at the first `}` and leave a literal `${B` plus a stray `}`.
      errors.push('"${" inside a reference or its default is not supported (write the default out, or set the variable)');
      break;
    }
    i = close + 1;
    if (reference.startsWith(FILE_PREFIX)) {
      const file = readSecretFile(reference.slice(FILE_PREFIX.length));
      if ('error' in file) errors.push(file.error);
      else out += file.text;
      continue;
    }
    const match = REFERENCE.exec(reference);
    if (match === null) {
      errors.push('invalid variable reference (expected ${NAME}, ${NAME:-default} or ${file:/path})');
      continue;
    }
    const [, name = '', fallback] = match;
    const value = env[name];
    // As in the shell, `:-` also replaces a variable that is set but empty.
    if (fallback !== undefined && (value === undefined || value === '')) {
      out += fallback;
    } else if (value === undefined) {
      errors.push(`environment variable ${name} is not set`);
    } else {
      out += value;
    }
  }
  return { text: out, errors };
}

/**
 * A file's content with one trailing newline removed: `echo secret > file` and editors add one,
 * and it is never part of the secret. Read on every load, so a SIGHUP picks up a rotated secret.
 */
function readSecretFile(path: string): { text: string } | { error: string } {
  if (!path.startsWith('/')) return { error: `\${file:...} needs an absolute path, got ${JSON.stringify(path)}` };
  try {
    return { text: readFileSync(path, 'utf8').replace(/\r?\n$/, '') };
  } catch (error) {
    return { error: `cannot read file ${path} (${(error as NodeJS.ErrnoException).code ?? 'unknown error'})` };
  }
}
