/**
 * The purge generations an entry was fetched under. Entries of older generations than an
 * instance knows are treated as absent: that is how a purge reaches Redis entries without
 * finding them (no KEYS or SCAN).
 */
export interface Generation {
  /** Counter of `all` purges. */
  readonly all: number;
  /** Counter of purges of the entry's scope since the last `all` purge (which resets it). */
  readonly scope: number;
}
