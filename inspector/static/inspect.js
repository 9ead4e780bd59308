// Hover or click a record: the turns it cites light up (click pins them); hover a turn: the records
// citing it light up. Records carry data-cites="t1 t3", turns data-turn="t3".
(function () {
  "use strict";
  const records = () => document.querySelectorAll("[data-cites]");
  const turns = (ids) => ids.flatMap((id) => Array.from(document.querySelectorAll(`[data-turn="${CSS.escape(id)}"]`)));
  const cites = (el) => el.dataset.cites.split(" ").filter(Boolean);

  function light(ids, on, cls) {
    turns(ids).forEach((t) => t.classList.toggle(cls, on));
  }

  records().forEach((record) => {
    record.addEventListener("mouseenter", () => light(cites(record), true, "lit"));
    record.addEventListener("mouseleave", () => light(cites(record), false, "lit"));
    record.addEventListener("click", () => {
      const pin = !record.classList.contains("pinned");
      records().forEach((other) => {
        other.classList.remove("pinned");
        light(cites(other), false, "pinned");
      });
      record.classList.toggle("pinned", pin);
      light(cites(record), pin, "pinned");
      const first = turns(cites(record))[0];
      if (pin && first) first.scrollIntoView({ block: "nearest" });
    });
  });

  document.querySelectorAll("[data-turn]").forEach((turn) => {
    const citing = () => Array.from(records()).filter((r) => cites(r).includes(turn.dataset.turn));
    turn.addEventListener("mouseenter", () => citing().forEach((r) => r.classList.add("lit")));
    turn.addEventListener("mouseleave", () => citing().forEach((r) => r.classList.remove("lit")));
  });
})();
