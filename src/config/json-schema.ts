import type { AnyNode, ObjNode } from './dsl.js';
import { CONFIG } from './schema.js';

type JsonSchema = Record<string, unknown>;

/**
 * Every string value may be `${ENV}` and is substituted before validation, so a number or a
 * boolean may be written as a string that references the environment.
 */
const FROM_ENV: JsonSchema = { type: 'string', pattern: '\\$\\{' };

/**
 * The JSON Schema (draft 2020-12) of the configuration file, generated from the definition
 * (schema.ts) for editors (`# yaml-language-server: $schema=...`): key names, types, ranges,
 * choices, defaults and meanings. The rules between keys are perch's (`perch --check-config`).
 */
export function configSchema(): JsonSchema {
  return {
    $schema: 'https://json-schema.org/draft/2020-12/schema',
    title: 'perch configuration',
    description: 'Generated from src/config/schema.ts (npm run schema); see docs/configuration.md.',
    ...objectSchema(CONFIG),
  };
}

/** A node's meaning as plain text: the Markdown table escapes its pipes. */
export function plainDoc(doc: string): string {
  return doc.replaceAll('\\|', '|');
}

function nodeSchema(node: AnyNode): JsonSchema {
  return { description: plainDoc(node.doc), ...shape(node) };
}

function shape(node: AnyNode): JsonSchema {
  const fallback = 'default' in node && node.default !== undefined ? { default: node.default } : {};
  switch (node.type) {
    case 'integer':
    case 'number': {
      const range = { minimum: node.min, ...(node.max === undefined || node.max === Number.MAX_VALUE ? {} : { maximum: node.max }) };
      const exact = node.type === 'number' && node.aboveMin === true ? { exclusiveMinimum: node.min } : range;
      const values = node.type === 'integer' && node.values !== undefined ? { enum: node.values } : exact;
      return { anyOf: [{ type: node.type, ...values }, FROM_ENV], ...fallback };
    }
    case 'boolean':
      return { anyOf: [{ type: 'boolean' }, FROM_ENV], ...fallback };
    case 'string':
      return { type: 'string', ...(node.enum === undefined ? {} : { enum: node.enum }), ...fallback };
    case 'string[]':
      return { type: 'array', minItems: 1, items: { type: 'string', ...(node.enum === undefined ? {} : { enum: node.enum }) }, ...fallback };
    case 'map':
      return { type: 'object', additionalProperties: { type: 'string' } };
    case 'object':
      return objectSchema(node);
    case 'record':
      if (node.keys !== undefined) {
        return { type: 'object', properties: Object.fromEntries(node.keys.map((key) => [key, nodeSchema(node.value)])), additionalProperties: false };
      }
      return {
        type: 'object',
        ...(node.pattern === undefined ? {} : { propertyNames: { pattern: node.pattern.test.source } }),
        additionalProperties: nodeSchema(node.value),
      };
    case 'list':
      return { type: 'array', minItems: 1, items: objectSchema(node.of) };
    case 'kinds':
      // One shape per kind, told apart by `kind`; each refuses the keys of the others.
      return {
        type: 'object',
        required: ['kind'],
        oneOf: Object.entries(node.branches).map(([kind, branch]) => {
          const schema = objectSchema(branch);
          const properties = schema.properties as Record<string, JsonSchema>;
          const { enum: _choices, ...rest } = properties.kind!;
          properties.kind = { ...rest, const: kind };
          return schema;
        }),
      };
  }
}

function objectSchema(node: ObjNode): JsonSchema {
  const properties = Object.fromEntries(Object.entries(node.props).map(([key, child]) => [key, nodeSchema(child)]));
  const required = Object.entries(node.props)
    .filter(([, child]) => 'required' in child && child.required === true)
    .map(([key]) => key);
  return { type: 'object', properties, ...(required.length > 0 ? { required } : {}), additionalProperties: false };
}
