// Read-only audit queries to start from: who asked for which write, what a write had in front
// of it, what derives from an event before it is erased, which facts were replaced.

export const EXAMPLES = [
  {
    title: "Writes on a supplier, and on whose instruction",
    query: `MATCH (a:Event)-[:SOURCE_FROM]->(i:Event)
WHERE a.supplier = $supplier AND a.effect = $effect AND i.kind = $kind
RETURN a.change, a.tool, i.actor, i.role
ORDER BY a.ts`,
    params: { supplier: "SUP-2207", effect: "write", kind: "turn" },
  },
  {
    title: "What a write had in front of it",
    query: `MATCH (a:Event)-[:SOURCE_FROM]->(s:Event)
WHERE a.change = $change
RETURN s.kind, s.text ORDER BY s.ts`,
    params: { change: "CHG-9038" },
  },
  {
    title: "Every write, with the instruction it names (if any)",
    query: `MATCH (a:Event) WHERE a.effect = 'write'
OPTIONAL MATCH (a)-[:SOURCE_FROM]->(i:Event {kind: 'turn'})
RETURN a.ts, a.supplier, a.tool, a.change, i.actor, i.role
ORDER BY a.ts`,
    params: {},
  },
  {
    title: "Writes that name no instruction",
    query: `MATCH (a:Event) WHERE a.effect = 'write'
OPTIONAL MATCH (a)-[:SOURCE_FROM]->(i:Event {kind: 'turn'})
WITH a, count(i) AS instructions
WHERE instructions = 0
RETURN a.ts, a.tool, a.change, a.event_id`,
    params: {},
  },
  {
    title: "What was derived from an event (before erasing it)",
    query: `MATCH (d:Event)-[:SOURCE_FROM*1..5]->(s:Event)
WHERE s.event_id = $id
RETURN DISTINCT d.event_id, d.kind, d.text`,
    params: { id: "paste an event id" },
  },
  {
    title: "What the agent's replies were based on",
    query: `MATCH (r:Event)-[:SOURCE_FROM]->(s:Event)
WHERE r.speaker = 'agent'
RETURN r.ts, r.event_id, r.text, collect(s.kind) AS source_kinds
ORDER BY r.ts`,
    params: {},
  },
  {
    title: "Facts and the versions they replace",
    query: `MATCH (new:Event)-[:SUPERSEDES]->(old:Event)
RETURN new.ts, new.text, old.text
ORDER BY new.ts DESC`,
    params: {},
  },
  {
    title: "The newest fact on a topic",
    query: `MATCH (f:Event)
WHERE f.kind = $kind AND f.topic = $topic
RETURN f.text ORDER BY f.ts DESC LIMIT 1`,
    params: { kind: "fact", topic: "cutover_date" },
  },
  {
    title: "Events by kind",
    query: `MATCH (e:Event)
RETURN e.kind AS kind, count(*) AS events
ORDER BY events DESC`,
    params: {},
  },
];
