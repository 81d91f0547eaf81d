// The console talks to the same HTTP API as any client, with the key its user typed. The key
// lives in this tab's sessionStorage only: never in a URL, a cookie or anything the server logs.

const KEY = "memspine.key";

export class ApiError extends Error {
  constructor(status, code, detail) {
    super(detail);
    this.status = status;
    this.code = code;
    this.detail = detail;
  }
}

export function storedKey() {
  return sessionStorage.getItem(KEY);
}

export function keepKey(key) {
  sessionStorage.setItem(KEY, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY);
}

/** Query parameters without empty values (the server refuses `?kind=`). */
export function query(params) {
  const q = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") q.append(name, String(value));
  }
  const text = q.toString();
  return text ? `?${text}` : "";
}

/** One request; resolves to {status, body}, rejects with ApiError for an error answer. */
export async function call(method, path, { body, key } = {}) {
  const token = key || storedKey();
  const headers = { Accept: "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "omit",
      cache: "no-store",
      redirect: "error",
    });
  } catch (err) {
    throw new ApiError(0, "network", "the server did not answer; is it still running?");
  }
  let data = null;
  try {
    data = await response.json();
  } catch (err) {
    data = null;
  }
  if (response.status === 401 && !key) {
    // The kept key stopped working (revoked, expired): the console signs out (main.js).
    window.dispatchEvent(new CustomEvent("memspine:unauthorized"));
  }
  if (!response.ok) {
    const code = data && data.error ? data.error : "http_" + response.status;
    const detail = data && data.detail ? data.detail : `the server answered ${response.status}`;
    throw new ApiError(response.status, code, detail);
  }
  return { status: response.status, body: data };
}

export const whoami = (key) => call("GET", "/v1/whoami", { key }).then((r) => r.body);
export const getEvent = (id) => call("GET", `/v1/memory/event/${encodeURIComponent(id)}`).then((r) => r.body);
export const listEvents = (params) => call("GET", "/v1/memory/events" + query(params)).then((r) => r.body);
export const recall = (body) => call("POST", "/v1/memory/recall", { body }).then((r) => r.body);
export const cypher = (q, params) =>
  call("POST", "/v1/memory/cypher", { body: { query: q, params: params || {} } }).then((r) => r.body);

/** DELETE an event: a dry run answers {would_delete}; a delete {deleted, purged, deleted_ids}. */
export function deleteEvent(id, { cascade, dryRun, purge }) {
  const params = query({
    cascade: cascade ? "derived" : undefined,
    dry_run: dryRun ? "true" : undefined,
    purge: purge ? "true" : undefined,
  });
  return call("DELETE", `/v1/memory/event/${encodeURIComponent(id)}${params}`);
}

/** POST an erasure by subject: a dry run answers {subject, events, count}; a real run
 * {receipt_id, receipt, deleted_ids}. */
export function eraseSubject(subject, body) {
  return call("POST", `/v1/memory/subjects/${encodeURIComponent(subject)}/erase`, { body });
}

/** The tenant's erasure receipts, newest first. */
export function receipts() {
  return call("GET", "/v1/memory/receipts");
}

/** One page of the tenant's read records (an audit key): {reads, next_cursor}. */
export const auditReads = (params) => call("GET", "/v1/memory/audit/reads" + query(params)).then((r) => r.body);

/** The tenant's retention windows, outlook, last run and legal holds. */
export const tenantRetention = () => call("GET", "/v1/memory/retention").then((r) => r.body);
