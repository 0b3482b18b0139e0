import { expectedInteger, expectedNumber, type AnyNode, type ObjNode, type StrListNode } from './dsl.js';
import { checkKeys, childPath, field, indexPath, isMapping, type Problems } from './schema-helpers.js';

/**
 * Marks a mapping that was reported as not one: it carries its defaults so the shape holds, and
 * the rules skip it rather than report what is missing from it.
 */
export const BROKEN = Symbol('reported as not a mapping');

export function isBroken(value: object): boolean {
  return Object.hasOwn(value, BROKEN);
}

/**
 * Validates a parsed, substituted configuration tree against its definition: types, ranges,
 * choices, required keys and unknown keys (with "did you mean"), reporting every problem with its
 * key path, and applies the defaults. The result is plain data for the cross-key rules (rules.ts);
 * after a problem it still has a value of the right shape wherever one was needed, so the rules
 * can run and report theirs in the same pass.
 */
export function walk(node: AnyNode, raw: unknown, path: string, problems: Problems): unknown {
  switch (node.type) {
    case 'integer': {
      const value = asNumber(raw);
      const ok =
        value !== undefined && Number.isSafeInteger(value) && value >= node.min && (node.max === undefined || value <= node.max) && (node.values?.includes(value) ?? true);
      if (ok) return value;
      problems.add(path, `must be ${expectedInteger(node)}`);
      return node.default ?? node.min;
    }
    case 'number': {
      const value = asNumber(raw);
      const ok = value !== undefined && Number.isFinite(value) && (node.aboveMin === true ? value > node.min : value >= node.min) && value <= node.max;
      if (ok) return value;
      problems.add(path, `must be ${expectedNumber(node)}`);
      return node.default ?? node.max;
    }
    case 'string': {
      if (typeof raw !== 'string') {
        problems.add(path, 'must be a string');
        return node.default ?? '';
      }
      if (node.enum !== undefined && !node.enum.includes(raw)) {
        problems.add(path, `must be ${node.expected ?? `one of ${node.enum.join(', ')}`}`);
        return node.default ?? node.enum[0];
      }
      return raw;
    }
    case 'boolean':
      if (raw === true || raw === 'true') return true;
      if (raw === false || raw === 'false') return false;
      problems.add(path, 'must be true or false');
      return node.default ?? false;
    case 'string[]':
      return stringList(node, raw, path, problems);
    case 'map':
      if (!isMapping(raw)) {
        problems.add(path, 'must be a mapping of header name to value');
        return {};
      }
      return { ...raw };
    case 'object':
      if (!isMapping(raw)) {
        problems.add(path, node.expected ?? 'must be a mapping');
        return { ...walkProps(node, {}, path, new SilentProblems()), [BROKEN]: true };
      }
      return walkProps(node, raw, path, problems);
    case 'record': {
      if (!isMapping(raw)) {
        problems.add(path, node.expected ?? 'must be a mapping');
        return {};
      }
      if (node.empty !== undefined && Object.keys(raw).length === 0) problems.add(path, node.empty);
      if (node.keys !== undefined) checkKeys(problems, raw, path, node.keys, node.unknown);
      const entries = Object.entries(raw).filter(([key]) => node.keys === undefined || node.keys.includes(key));
      return Object.fromEntries(
        entries.map(([key, value]) => {
          const at = childPath(path, key);
          if (node.pattern !== undefined && !node.pattern.test.test(key)) problems.add(at, node.pattern.message);
          return [key, walk(node.value, value, at, problems)];
        }),
      );
    }
    case 'list': {
      if (!Array.isArray(raw) || raw.length === 0) {
        problems.add(path, node.expected ?? 'must be a non-empty list');
        return [];
      }
      return raw.map((entry: unknown, i) => walk(node.of, entry, indexPath(path, i), problems));
    }
    case 'kinds': {
      if (!isMapping(raw)) {
        problems.add(path, node.expected ?? 'must be a mapping');
        return { kind: 'fixture' };
      }
      const kind = field(raw, 'kind');
      const branch = typeof kind === 'string' && Object.hasOwn(node.branches, kind) ? node.branches[kind as keyof typeof node.branches] : undefined;
      if (branch === undefined) {
        const names = Object.keys(node.branches);
        const quoted = `${names.slice(0, -1).map((n) => JSON.stringify(n)).join(', ')} or ${JSON.stringify(names.at(-1))}`;
        problems.add(childPath(path, 'kind'), kind === undefined ? `is required (${names.slice(0, -1).join(', ')} or ${names.at(-1)})` : `must be ${quoted}`);
        return { kind: 'fixture' };
      }
      return walkProps(branch, raw, path, problems);
    }
  }
}

/** The keys of a mapping: unknown ones reported, each known one checked or defaulted. */
function walkProps(node: ObjNode, raw: Record<string, unknown>, path: string, problems: Problems): Record<string, unknown> {
  checkKeys(problems, raw, path, Object.keys(node.props), node.unknown, node.foreign);
  const out: Record<string, unknown> = {};
  for (const [key, child] of Object.entries(node.props)) {
    const value = field(raw, key);
    const at = childPath(path, key);
    if (value !== undefined) out[key] = walk(child, value, at, problems);
    else if (isRequired(child)) {
      problems.add(at, ('missing' in child ? child.missing : undefined) ?? 'is required');
      out[key] = fallback(child);
    } else if ('default' in child && child.default !== undefined) out[key] = copy(child.default);
    else if ('section' in child && child.section === true) out[key] = walk(child, {}, at, problems);
  }
  return out;
}

function stringList(node: StrListNode, raw: unknown, path: string, problems: Problems): string[] {
  const of = node.of ?? node.enum?.join(', ');
  if (!Array.isArray(raw) || raw.length === 0) {
    problems.add(path, of === undefined ? 'must be a non-empty list' : `must be a non-empty list of ${of}`);
    return [...(node.default ?? [])];
  }
  const seen: string[] = [];
  raw.forEach((item: unknown, i) => {
    const at = indexPath(path, i);
    if (typeof item !== 'string') problems.add(at, node.item ?? 'must be a string');
    else if (node.enum !== undefined && !node.enum.includes(item)) problems.add(at, `must be one of ${node.enum.join(', ')}`);
    else if (node.enum !== undefined && seen.includes(item)) problems.add(at, `repeats ${item}`);
    else seen.push(item);
  });
  return node.enum === undefined ? raw.filter((item): item is string => typeof item === 'string') : seen;
}

function isRequired(node: AnyNode): boolean {
  return 'required' in node && node.required === true;
}

/** A value of the right shape for a key reported missing, so the rules can still run. */
function fallback(node: AnyNode): unknown {
  switch (node.type) {
    case 'integer':
    case 'number':
      return node.default ?? node.min;
    case 'string':
      return node.default ?? '';
    case 'boolean':
      return false;
    case 'string[]':
    case 'list':
      return [];
    case 'object':
      return walkProps(node, {}, '', new SilentProblems());
    case 'kinds':
      return { kind: 'fixture' };
    default:
      return {};
  }
}

function copy(value: unknown): unknown {
  return Array.isArray(value) ? [...value] : isMapping(value) ? { ...value } : value;
}

/**
 * Environment substitution always yields strings, so `port: "${PORT:-8080}"` must be accepted:
 * a string holding a plain decimal number counts as that number.
 */
function asNumber(value: unknown): number | undefined {
  if (typeof value === 'number') return value;
  if (typeof value === 'string' && /^-?\d+(\.\d+)?$/.test(value)) return Number(value);
  return undefined;
}

/** Collects nothing: for the defaults of a section that was reported as not a mapping. */
class SilentProblems {
  readonly list: string[] = [];
  add(): void {}
}
