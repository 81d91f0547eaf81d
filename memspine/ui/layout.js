// A layered layout for a provenance graph: one column per hop (sources to the left of the event,
// what was derived from it to the right), rows ordered by the barycentre of their neighbours in
// the other columns to keep crossings few, columns centred on each other.

export const NODE_W = 210;
export const NODE_H = 64;
const COL_GAP = 70;
const ROW_GAP = 16;
const PAD = 14;
const SWEEPS = 4;
const BOW = 36;

function byTime(a, b) {
  return a.ts - b.ts || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
}

/**
 * Place nodes ({id, layer, ts}) joined by edges ({from, to}).
 * Returns {at: Map id -> {x, y}, width, height}.
 */
export function layout(nodes, edges) {
  const layers = [...new Set(nodes.map((n) => n.layer))].sort((a, b) => a - b);
  const columns = new Map(layers.map((l) => [l, nodes.filter((n) => n.layer === l).sort(byTime)]));
  const layerOf = new Map(nodes.map((n) => [n.id, n.layer]));
  const neighbours = new Map(nodes.map((n) => [n.id, []]));
  for (const e of edges) {
    if (!neighbours.has(e.from) || !neighbours.has(e.to)) continue;
    neighbours.get(e.from).push(e.to);
    neighbours.get(e.to).push(e.from);
  }
  const rowOf = () => {
    const row = new Map();
    for (const col of columns.values()) col.forEach((n, i) => row.set(n.id, i - (col.length - 1) / 2));
    return row;
  };
  for (let sweep = 0; sweep < SWEEPS; sweep++) {
    const order = sweep % 2 === 0 ? layers : [...layers].reverse();
    for (const l of order) {
      const row = rowOf();
      const centre = (n) => {
        const others = neighbours.get(n.id).filter((m) => layerOf.get(m) !== l);
        if (!others.length) return row.get(n.id);
        return others.reduce((sum, m) => sum + row.get(m), 0) / others.length;
      };
      const keyed = columns.get(l).map((n) => [centre(n), n]);
      keyed.sort((a, b) => a[0] - b[0] || byTime(a[1], b[1]));
      columns.set(l, keyed.map(([, n]) => n));
    }
  }
  const tallest = Math.max(1, ...[...columns.values()].map((c) => c.length));
  const at = new Map();
  layers.forEach((l, ci) => {
    const col = columns.get(l);
    const offset = (tallest - col.length) / 2;
    col.forEach((n, ri) => {
      at.set(n.id, {
        x: PAD + ci * (NODE_W + COL_GAP),
        y: PAD + (ri + offset) * (NODE_H + ROW_GAP),
      });
    });
  });
  const column = new Map(layers.map((l, ci) => [l, ci]));
  // A link that skips a column bows below the nodes instead of running through them.
  const long = edges.some((e) => at.has(e.from) && at.has(e.to) && Math.abs(column.get(layerOf.get(e.from)) - column.get(layerOf.get(e.to))) > 1);
  const height = PAD * 2 + tallest * NODE_H + (tallest - 1) * ROW_GAP;
  return {
    at,
    width: PAD * 2 + layers.length * NODE_W + Math.max(0, layers.length - 1) * COL_GAP,
    height: long ? height + BOW : height,
    floor: height - PAD,
  };
}

/**
 * The SVG path of an edge between two placed nodes: side to side between neighbouring columns,
 * under the nodes when it skips a column, an arc beside a column within one; `shift` moves
 * both ends down (a SUPERSEDES link beside a SOURCE_FROM link between the same two events).
 */
export function edgePath(a, b, floor, shift = 0) {
  const ay = a.y + NODE_H / 2 + shift;
  const by = b.y + NODE_H / 2 + shift;
  if (a.x === b.x) {
    const x = a.x + NODE_W;
    return `M ${x} ${ay} C ${x + 40} ${ay}, ${x + 40} ${by}, ${x} ${by}`;
  }
  const [ax, bx] = a.x < b.x ? [a.x + NODE_W, b.x] : [a.x, b.x + NODE_W];
  if (Math.abs(a.x - b.x) > NODE_W * 1.5 + 10) {
    const low = floor + BOW;
    return `M ${ax} ${ay} C ${ax + Math.sign(bx - ax) * 60} ${low}, ${bx - Math.sign(bx - ax) * 60} ${low}, ${bx} ${by}`;
  }
  const mid = (ax + bx) / 2;
  return `M ${ax} ${ay} C ${mid} ${ay}, ${mid} ${by}, ${bx} ${by}`;
}
