import { Ajv2020, type ErrorObject, type ValidateFunction } from 'ajv/dist/2020.js';
import { ENDPOINT_NAMES, type EndpointName } from '../endpoints.js';
import { RESPONSE_SCHEMA, SCHEMAS } from './resources.js';

// The schemas' refs point into an OpenAPI document (`#/components/schemas/...`), so they are
// registered as one under this id and each endpoint's validator is a ref into it: the compiled
// code then follows exactly the objects that /openapi.json serves.
const DOCUMENT_ID = 'perch:openapi';

/**
 * Compiled once, when the module loads, so a miss pays only the generated code. `allErrors` stays
 * off: the first failure is enough to refuse a body, and stopping there keeps a bad body cheap.
 * Strict mode rejects a schema keyword ajv would silently ignore, which would be a check that
 * the document promises and perch never makes.
 */
const VALIDATORS: Readonly<Record<EndpointName, ValidateFunction>> = compileValidators();

function compileValidators(): Record<EndpointName, ValidateFunction> {
  const ajv = new Ajv2020({ strict: true, allErrors: false });
  // `components` is no JSON Schema keyword; it only holds the schemas the refs point into.
  ajv.addKeyword('components');
  ajv.addSchema({ $id: DOCUMENT_ID, components: { schemas: SCHEMAS } });
  const validators = {} as Record<EndpointName, ValidateFunction>;
  for (const endpoint of ENDPOINT_NAMES) {
    validators[endpoint] = ajv.compile({ $ref: `${DOCUMENT_ID}#/components/schemas/${RESPONSE_SCHEMA[endpoint]}` });
  }
  return validators;
}

/**
 * Checks a parsed 2xx upstream body against the full shape of its endpoint's response: every
 * field of the interface's tables with its JSON type (extra fields allowed). Returns undefined
 * when the body fits, else where it does not, e.g.
 * `/data/users/3/result/legacy/followers_count must be number`. The description holds JSON paths
 * and schema terms only, never a value from the body, so it is safe to log.
 */
export function checkResponseBody(endpoint: EndpointName, body: unknown): string | undefined {
  const validate = VALIDATORS[endpoint];
  if (validate(body)) return undefined;
  const error = validate.errors?.[0];
  return error === undefined ? 'body does not match the schema' : describe(error);
}

function describe(error: ErrorObject): string {
  // Paths name only properties the schemas declare and array indices: no body content.
  if (error.keyword === 'required') {
    const missing = (error.params as { missingProperty: string }).missingProperty;
    return `${error.instancePath}/${escapePointer(missing)} is missing`;
  }
  const where = error.instancePath === '' ? 'the body' : error.instancePath;
  if (error.keyword === 'type') return `${where} must be ${(error.params as { type: string }).type}`;
  // ajv's own messages for the remaining keywords (pattern, enum) quote the schema, not the data.
  return `${where} ${error.message ?? `fails ${error.keyword}`}`;
}

/** RFC 6901: the required property's name joins the pointer like any other segment. */
function escapePointer(segment: string): string {
  return segment.replaceAll('~', '~0').replaceAll('/', '~1');
}
