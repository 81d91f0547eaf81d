// Times are microseconds since the epoch in the API; the console shows and reads them in UTC.

/** "2026-10-05 14:02:19 UTC" for a time in microseconds. */
export function when(us) {
  if (typeof us !== "number" || !Number.isFinite(us)) return "—";
  const date = new Date(Math.floor(us / 1000));
  if (Number.isNaN(date.getTime())) return String(us);
  return date.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

/** The value of a datetime-local input, read as UTC, in microseconds; null when empty. */
export function fromInput(value) {
  if (!value) return null;
  const m = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})(?::(\d{2}))?/.exec(value);
  if (!m) return null;
  const ms = Date.UTC(+m[1], +m[2] - 1, +m[3], +m[4], +m[5], +(m[6] || 0));
  return ms * 1000;
}

/** A time in microseconds as a datetime-local value in UTC. */
export function toInput(us) {
  return new Date(Math.floor(us / 1000)).toISOString().slice(0, 19);
}

/** The first n characters of a text, with an ellipsis when cut. */
export function clip(text, n) {
  const s = text === null || text === undefined ? "" : String(text);
  return s.length > n ? s.slice(0, n - 1) + "…" : s;
}

/** A property value as the JSON it was sent as. */
export function json(value) {
  return JSON.stringify(value);
}

/** The state of an event now: superseded, expired, not yet valid or current. */
export function stateOf(event, supersededBy) {
  const now = Date.now() * 1000;
  if (supersededBy && supersededBy.length) return "superseded";
  if (typeof event.valid_until === "number" && event.valid_until <= now) return "expired";
  if (typeof event.valid_from === "number" && event.valid_from > now) return "not yet valid";
  return "current";
}

export function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many || one + "s"}`;
}
