/**
 * The building blocks of the one definition of the configuration file (schema.ts): each node
 * carries a key's type, default, range or choices, meaning and the upstream kinds it applies to.
 * Everything else is derived from the nodes: validation (walk.ts), the TypeScript types
 * (`Infer`), the editor schema (json-schema.ts) and the configuration table of
 * docs/configuration.md (readme-table.ts). A new key is one node here plus its use.
 */

/** The upstream kinds; a key under `upstreams.<name>` exists for the kinds whose branch lists it. */
export type UpstreamKind = 'v1' | 'x_v2' | 'fixture';

interface Documented {
  /** The key's meaning: the configuration table's "meaning" column and the editor schema's description. */
  readonly doc: string;
  /** The configuration table's default column when it is prose (`-`, `the first upstream`), not the default as code. */
  readonly readme?: string;
}

export interface IntNode extends Documented {
  readonly type: 'integer';
  readonly min: number;
  readonly max?: number;
  /** The only values allowed, when they are a few (the type is then their union). */
  readonly values?: readonly number[];
  readonly default?: number;
  readonly required?: boolean;
  /** What a valid value is, reported as `must be ...`; derived from the range when absent. */
  readonly expected?: string;
}

export interface NumNode extends Documented {
  readonly type: 'number';
  readonly min: number;
  readonly max: number;
  /** A value must be above `min` rather than at least `min`. */
  readonly aboveMin?: boolean;
  readonly default?: number;
  readonly required?: boolean;
  readonly expected?: string;
}

export interface StrNode<T extends string = string> extends Documented {
  readonly type: 'string';
  readonly enum?: readonly T[];
  readonly default?: T;
  readonly required?: boolean;
  /** The message when absent and required, in place of `is required`. */
  readonly missing?: string;
  /** The message for a value outside `enum`, in place of `must be one of ...`. */
  readonly expected?: string;
}

export interface BoolNode extends Documented {
  readonly type: 'boolean';
  readonly default?: boolean;
}

/** A list of strings, optionally from a fixed set, never empty. */
export interface StrListNode<T extends string = string> extends Documented {
  readonly type: 'string[]';
  readonly enum?: readonly T[];
  /** What the items are, for the message about a list that is not one (`upstream names`). */
  readonly of?: string;
  /** The message for an item that is not a string, in place of `must be a string`. */
  readonly item?: string;
  readonly default?: readonly T[];
  readonly required?: boolean;
}

/** A mapping of strings to strings (headers); the rules check names and values. */
export interface MapNode extends Documented {
  readonly type: 'map';
  readonly required?: boolean;
}

export type Props = Readonly<Record<string, AnyNode>>;

export interface ObjNode<P extends Props = Props> extends Documented {
  readonly type: 'object';
  readonly props: P;
  /** Absent reads as an empty mapping, so every default inside applies. */
  readonly section?: boolean;
  readonly required?: boolean;
  /** The message when present but not a mapping, in place of `must be a mapping`. */
  readonly expected?: string;
  /** The message when absent and required. */
  readonly missing?: string;
  /** The hint for an unknown key, in place of "did you mean". */
  readonly unknown?: string;
  /** Keys of another branch of the same `kinds`, each with why this branch takes none. */
  readonly foreign?: Readonly<Record<string, string>>;
}

/** A mapping whose keys are the operator's choice (`<plan>`, `<name>`) or the endpoint names. */
export interface RecordNode<V extends AnyNode = AnyNode> extends Documented {
  readonly type: 'record';
  /** How the configuration table and key paths name a key: `<plan>`, `<name>`, `<endpoint>`. */
  readonly placeholder: string;
  readonly value: V;
  /** Allowed keys; absent: any key matching `pattern`. */
  readonly keys?: readonly string[];
  readonly pattern?: { readonly test: RegExp; readonly message: string };
  readonly required?: boolean;
  readonly section?: boolean;
  readonly missing?: string;
  readonly expected?: string;
  /** Reported when the mapping is present and empty; absent: empty is fine. */
  readonly empty?: string;
  readonly unknown?: string;
}

/** A list of mappings (keys, credentials). */
export interface ListNode<O extends ObjNode = ObjNode> extends Documented {
  readonly type: 'list';
  readonly of: O;
  readonly required?: boolean;
  readonly missing?: string;
  readonly expected?: string;
}

/** A mapping told apart by its `kind` key: one branch of keys per kind. */
export interface KindsNode<B extends Readonly<Record<UpstreamKind, ObjNode>> = Readonly<Record<UpstreamKind, ObjNode>>> extends Documented {
  readonly type: 'kinds';
  readonly branches: B;
  readonly expected?: string;
}

export type AnyNode = IntNode | NumNode | StrNode | BoolNode | StrListNode | MapNode | ObjNode | RecordNode | ListNode | KindsNode;

/** Whether a key is always present after validation: required, defaulted, or a section. */
type Present<N> = N extends { readonly default: unknown } ? true : N extends { readonly required: true } ? true : N extends { readonly section: true } ? true : false;

type InferProps<P extends Props> = {
  readonly [K in keyof P as Present<P[K]> extends true ? K : never]: Infer<P[K]>;
} & {
  readonly [K in keyof P as Present<P[K]> extends true ? never : K]?: Infer<P[K]>;
};

type Flatten<T> = { [K in keyof T]: T[K] } & {};

type Choice<N> = N extends { readonly enum: readonly (infer T)[] } ? T : string;

/** The validated value a node describes. */
export type Infer<N> = N extends { readonly type: 'integer'; readonly values: readonly (infer V)[] }
  ? V
  : N extends { readonly type: 'integer' | 'number' }
  ? number
  : N extends { readonly type: 'string' }
    ? Choice<N>
    : N extends { readonly type: 'boolean' }
      ? boolean
      : N extends { readonly type: 'string[]' }
        ? readonly Choice<N>[]
        : N extends { readonly type: 'map' }
          ? Readonly<Record<string, string>>
          : N extends { readonly type: 'object'; readonly props: infer P extends Props }
            ? Flatten<InferProps<P>>
            : N extends { readonly type: 'record'; readonly value: infer V }
              ? Readonly<Record<string, Infer<V>>>
              : N extends { readonly type: 'list'; readonly of: infer O }
                ? readonly Infer<O>[]
                : N extends { readonly type: 'kinds'; readonly branches: infer B }
                  ? { [K in keyof B]: Infer<B[K]> }[keyof B]
                  : never;

type Options<N> = Omit<N, 'type' | 'props' | 'value' | 'of' | 'branches'>;

export const int = <const O extends Options<IntNode>>(o: O): O & { readonly type: 'integer' } => ({ type: 'integer', ...o });
export const num = <const O extends Options<NumNode>>(o: O): O & { readonly type: 'number' } => ({ type: 'number', ...o });
export const str = <const O extends Options<StrNode>>(o: O): O & { readonly type: 'string' } => ({ type: 'string', ...o });
export const bool = <const O extends Options<BoolNode>>(o: O): O & { readonly type: 'boolean' } => ({ type: 'boolean', ...o });
export const strList = <const O extends Options<StrListNode>>(o: O): O & { readonly type: 'string[]' } => ({ type: 'string[]', ...o });
export const map = <const O extends Options<MapNode>>(o: O): O & { readonly type: 'map' } => ({ type: 'map', ...o });
export const obj = <const P extends Props, const O extends Options<ObjNode>>(props: P, o: O): O & { readonly type: 'object'; readonly props: P } => ({
  type: 'object',
  props,
  ...o,
});
export const record = <const V extends AnyNode, const O extends Options<RecordNode>>(value: V, o: O): O & { readonly type: 'record'; readonly value: V } => ({
  type: 'record',
  value,
  ...o,
});
export const list = <const E extends ObjNode, const O extends Options<ListNode>>(of: E, o: O): O & { readonly type: 'list'; readonly of: E } => ({
  type: 'list',
  of,
  ...o,
});
export const kinds = <const B extends Readonly<Record<UpstreamKind, ObjNode>>, const O extends Options<KindsNode>>(
  branches: B,
  o: O,
): O & { readonly type: 'kinds'; readonly branches: B } => ({ type: 'kinds', branches, ...o });

/** The `must be ...` of an integer node. */
export function expectedInteger(node: IntNode): string {
  if (node.expected !== undefined) return node.expected;
  if (node.max !== undefined) return `an integer from ${node.min} to ${node.max}`;
  return node.min === 1 ? 'a positive integer' : `an integer of at least ${node.min}`;
}

/** The `must be ...` of a number node. */
export function expectedNumber(node: NumNode): string {
  return node.expected ?? `a number from ${node.min} to ${node.max}`;
}
