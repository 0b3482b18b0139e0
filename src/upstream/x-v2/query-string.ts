/**
 * A v2 path with its query, parameters in the order given. X answers 400 to an unknown or
 * repeated parameter, so each request names exactly the parameters it needs, once. Field lists
 * are perch's own constants and go out with their commas as X documents them; the only value
 * from a client, the pagination token, is percent-encoded.
 */
export function v2Path(path: string, params: Readonly<Record<string, string | number | undefined>>): string {
  const pairs = Object.entries(params)
    .filter((entry): entry is [string, string | number] => entry[1] !== undefined)
    .map(([key, value]) => `${key}=${key === 'pagination_token' ? encodeURIComponent(String(value)) : String(value)}`);
  return pairs.length === 0 ? path : `${path}?${pairs.join('&')}`;
}
