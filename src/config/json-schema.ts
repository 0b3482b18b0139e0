import { ENDPOINT_NAMES } from '../endpoints.js';
import { CONFIG_KEYS, appliesTo, keysUnder, type ConfigKey, type UpstreamKind } from './config-keys.js';
import type { Describe } from './readme-table.js';

type JsonSchema = Record<string, unknown>;

const UPSTREAM = 'upstreams.<name>';
const KINDS: readonly UpstreamKind[] = ['v1', 'x_v2', 'fixture'];

/**
 * Every string value may be `${ENV}` and is substituted before validation, so a number or a
 * boolean may be written as a string that references the environment.
 */
const FROM_ENV: JsonSchema = { type: 'string', pattern: '\\$\\{' };

/**
 * The JSON Schema (draft 2020-12) of the configuration file, generated from `CONFIG_KEYS`, for
 * editors (`# yaml-language-server: $schema=...`). It checks key names and types; ranges and
 * rules between keys are the validator's (`perch --check-config`). `describe` supplies each
 * key's description (the README's "meaning" column), so the documentation is written once.
 */
export function configSchema(describe: Describe = () => undefined): JsonSchema {
  return {
    $schema: 'https://json-schema.org/draft/2020-12/schema',
    title: 'perch configuration',
    description: 'Generated from src/config/config-keys.ts (npm run schema); see the README, "Configuration reference".',
    ...objectSchema('', undefined, describe),
  };
}

function objectSchema(parent: string, kind: UpstreamKind | undefined, describe: Describe): JsonSchema {
  const properties: Record<string, JsonSchema> = {};
  const required: string[] = [];
  for (const name of keysUnder(parent, kind)) {
    const path = parent === '' ? name : `${parent}.${name}`;
    properties[name] = nodeSchema(path, kind, describe);
    if (entry(path, kind)?.required === true || entry(`${path}[]`, kind)?.required === true) required.push(name);
  }
  const map = mapSegment(parent);
  let additional: JsonSchema | false = false;
  if (map === '<endpoint>') {
    for (const endpoint of ENDPOINT_NAMES) properties[endpoint] = nodeSchema(`${parent}.${map}`, kind, describe);
  } else if (map !== undefined) {
    additional = nodeSchema(`${parent}.${map}`, kind, describe);
  }
  return { type: 'object', properties, ...(required.length > 0 ? { required } : {}), additionalProperties: additional };
}

function nodeSchema(path: string, kind: UpstreamKind | undefined, describe: Describe): JsonSchema {
  const schema = shape(path, kind, describe);
  const description = describe(path, kind) ?? describe(`${path}[]`, kind);
  return description === undefined ? schema : { description, ...schema };
}

function shape(path: string, kind: UpstreamKind | undefined, describe: Describe): JsonSchema {
  if (path === UPSTREAM) {
    // One shape per kind, told apart by `kind`; each refuses the keys of the others.
    return {
      type: 'object',
      required: ['kind'],
      oneOf: KINDS.map((each) => {
        const branch = objectSchema(UPSTREAM, each, describe);
        const properties = branch.properties as Record<string, JsonSchema>;
        properties.kind = { ...properties.kind, const: each };
        delete properties.kind.enum;
        return branch;
      }),
    };
  }
  const list = entry(`${path}[]`, kind);
  if (list !== undefined) return { type: 'array', minItems: 1, items: objectSchema(`${path}[]`, kind, describe) };
  const key = entry(path, kind);
  switch (key?.type ?? 'object') {
    case 'object':
      return objectSchema(path, kind, describe);
    case 'map':
      return { type: 'object', additionalProperties: { type: 'string' }, ...withDefault(key) };
    case 'string[]':
      return { type: 'array', minItems: 1, items: { type: 'string', ...(key?.enum === undefined ? {} : { enum: key.enum }) }, ...withDefault(key) };
    case 'string':
      return { type: 'string', ...(key?.enum === undefined ? {} : { enum: key.enum }), ...withDefault(key) };
    default:
      return { anyOf: [{ type: key!.type }, FROM_ENV], ...withDefault(key) };
  }
}

function withDefault(key: ConfigKey | undefined): JsonSchema {
  return key?.default === undefined ? {} : { default: key.default };
}

function entry(path: string, kind: UpstreamKind | undefined): ConfigKey | undefined {
  return CONFIG_KEYS.find((key) => key.path === path && (kind === undefined || appliesTo(key, kind)));
}

/** The `<...>` segment right under `parent`, when its keys are the operator's choice. */
function mapSegment(parent: string): string | undefined {
  const prefix = parent === '' ? '' : `${parent}.`;
  for (const key of CONFIG_KEYS) {
    if (!key.path.startsWith(`${prefix}<`)) continue;
    return /^<[^>]+>/.exec(key.path.slice(prefix.length))?.[0];
  }
  return undefined;
}
