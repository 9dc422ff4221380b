/**
 * URLs of the lancefn server extension, always built from JupyterLab's `baseUrl`
 * (`ServerConnection.makeSettings().baseUrl`) so the panel works under any `base_url`, behind
 * JupyterHub and behind proxies. Pure: unit-tested in src/__tests__/urls.spec.ts.
 */

/** URL namespace of the server extension (`<base_url>/lancefn/`). */
export const NAMESPACE = 'lancefn';

function joinPath(baseUrl: string, ...parts: string[]): string {
  const base = baseUrl.endsWith('/') ? baseUrl : `${baseUrl}/`;
  const tail = parts
    .map(p => p.replace(/^\/+|\/+$/g, ''))
    .filter(p => p.length > 0)
    .join('/');
  return base + tail;
}

/** `<base>/lancefn/status`: is the control plane reachable, which one (URL without key). */
export function statusUrl(baseUrl: string): string {
  return joinPath(baseUrl, NAMESPACE, 'status');
}

/** `<base>/lancefn/api/v1/<path>`: the allow-listed proxy to the control plane's REST API. */
export function apiUrl(baseUrl: string, path: string): string {
  return joinPath(baseUrl, NAMESPACE, 'api', 'v1', path);
}

/**
 * The proxied Server-Sent Events URL. `EventSource` cannot send headers, so when JupyterLab runs
 * with a token it goes in the query (as JupyterLab does for websockets); without a token the
 * login cookie authenticates the request. `lastEventId` resumes after a reconnect that the panel
 * makes itself (the browser adds the `Last-Event-ID` header only on its own reconnects).
 */
export function eventsUrl(
  baseUrl: string,
  options: { token?: string | null; lastEventId?: string | null } = {}
): string {
  const params: string[] = [];
  if (options.lastEventId) {
    params.push(`last_event_id=${encodeURIComponent(options.lastEventId)}`);
  }
  if (options.token) {
    params.push(`token=${encodeURIComponent(options.token)}`);
  }
  const url = apiUrl(baseUrl, 'jobs/events');
  return params.length ? `${url}?${params.join('&')}` : url;
}
