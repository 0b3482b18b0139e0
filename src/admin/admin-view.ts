import type { KeyStore } from '../auth/key-store.js';
import type { Config } from '../config/types.js';
import type { UpstreamSet } from '../upstream/upstream-set.js';

/**
 * What the admin routes read of the running instance, read per request because a SIGHUP reload
 * replaces it. The composition root's `Runtime` is one; admin/ names only what it uses, so it
 * depends on nothing above it.
 */
export interface AdminView {
  readonly current: {
    readonly config: Config;
    /** Absent without an `admin` section: then the admin routes do not exist. */
    readonly adminKeys?: KeyStore;
    /** The client keys, for each secret's last use. */
    readonly keys: KeyStore;
    readonly upstreams: UpstreamSet;
  };
  /** The start-up configuration: the settings a reload cannot change run at its values. */
  readonly started: Config;
  readonly reloadStatus: { readonly successful: boolean; readonly lastSuccessMs: number };
}
