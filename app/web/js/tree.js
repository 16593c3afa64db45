// The message tree: siblings of a message ("2 of 3"), the leaf a branch leads to, and
// the whole tree as an outline (indented only where a conversation branches).

import { h, fill, short } from "./dom.js";

export class Tree {
  constructor(nodes = []) {
    this.nodes = new Map(nodes.map((n) => [n.uuid, n]));
    this.children = new Map();
    for (const node of nodes) {
      const key = parentOf(node);
      if (!this.children.has(key)) this.children.set(key, []);
      this.children.get(key).push(node);
    }
  }

  kids(uuid) {
    return this.children.get(uuid ?? null) || [];
  }

  /** Versions of a message: messages of the same role under the same parent. */
  siblings(msg) {
    if (!this.nodes.has(msg.uuid) || msg.subtype) return null;
    const list = this.kids(msg.parent_uuid ?? null).filter(
      (n) => n.role === msg.role && !n.subtype && n.type === msg.type,
    );
    if (list.length < 2) return null;
    return { list, index: list.findIndex((n) => n.uuid === msg.uuid) + 1, count: list.length };
  }

  /** Where a branch leads: follow the newest child down to a leaf. */
  leaf(uuid) {
    let current = uuid;
    for (let guard = 0; guard < 100000; guard++) {
      const kids = this.kids(current).filter((n) => n.parent_uuid === current);
      if (!kids.length) return current;
      current = kids[kids.length - 1].uuid;
    }
    return current;
  }
}

/** A compact boundary has no parent; it hangs under the message it follows. */
function parentOf(node) {
  return node.parent_uuid ?? node.logical_parent_uuid ?? null;
}

export function renderTree(root, tree, chain, head, onPick, busy) {
  if (!tree.nodes.size) {
    fill(root, h("p", { class: "note" }, "No messages yet."));
    return;
  }
  const onChain = new Set(chain);
  const line = (node) => {
    const label = node.subtype
      ? `${node.subtype.replace("_", " ")}`
      : node.role === "assistant"
        ? "Assistant"
        : "You";
    return h(
      "button",
      {
        type: "button",
        class: `node ${node.role || node.type}${onChain.has(node.uuid) ? " on-chain" : ""}`,
        "aria-current": node.uuid === head ? "true" : null,
        title: `Move the head to ${short(node.uuid)}`,
        disabled: busy || node.subtype === "compact_boundary",
        onclick: () => onPick(node.uuid),
      },
      h("span", { class: "who" }, label),
      " ",
      h("span", { class: "preview" }, node.preview || "…"),
      node.uuid === head ? h("span", { class: "badge" }, "head") : null,
    );
  };
  // A straight run of single children stays in one list; a fork opens one sub-list per branch.
  const branch = (start) => {
    const items = [];
    let node = start;
    for (;;) {
      items.push(h("li", {}, line(node)));
      const kids = tree.kids(node.uuid);
      if (kids.length === 1) {
        node = kids[0];
        continue;
      }
      if (kids.length > 1)
        items.push(
          h(
            "li",
            { class: "fork" },
            kids.map((k) => h("ul", { class: "branch" }, branch(k))),
          ),
        );
      return items;
    }
  };
  // Several roots (a first message edited, a conversation cleared) fork at the top.
  const roots = tree.kids(null);
  const top =
    roots.length === 1
      ? branch(roots[0])
      : [
          h(
            "li",
            { class: "fork" },
            roots.map((r) => h("ul", { class: "branch" }, branch(r))),
          ),
        ];
  fill(
    root,
    h(
      "div",
      { class: "outline", role: "group", "aria-label": "Message tree" },
      h("ul", { class: "branch" }, top),
    ),
  );
}
