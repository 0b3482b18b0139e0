/** The hash slot (0-16383) Redis Cluster assigns a key, hash tags included. */
declare module 'cluster-key-slot' {
  export default function calculateSlot(key: string | Buffer): number;
}
