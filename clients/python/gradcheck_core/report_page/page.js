// Draws each graph of a gradcheck HTML report from the JSON in #gradcheck-data: positions from
// Graphviz (layout "dot") or laid out here by dagre (layout "dagre"); hovering a node shows its
// op, shape, fingerprint status and local error. Every user string goes in as textContent.
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var data = JSON.parse(document.getElementById("gradcheck-data").textContent);
  var tip = document.getElementById("gradcheck-tip");

  function el(name, attrs, parent) {
    var e = document.createElementNS(SVG, name);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, String(attrs[k])); });
    if (parent) { parent.appendChild(e); }
    return e;
  }

  function layOut(view) {
    var g = new dagre.graphlib.Graph();
    g.setGraph({ rankdir: "TB", nodesep: 20, ranksep: 32, marginx: 8, marginy: 8 });
    g.setDefaultEdgeLabel(function () { return {}; });
    view.nodes.forEach(function (n) { g.setNode(n.id, { width: n.w, height: n.h }); });
    view.edges.forEach(function (e) { g.setEdge(e.from, e.to); });
    dagre.layout(g);
    view.nodes.forEach(function (n) { var p = g.node(n.id); n.x = p.x; n.y = p.y; });
    view.edges.forEach(function (e) {
      e.points = g.edge(e.from, e.to).points.map(function (p) { return [p.x, p.y]; });
    });
    view.width = g.graph().width;
    view.height = g.graph().height;
  }

  function edgePath(e) {
    if (e.spline && e.spline.length >= 4) {  // dot: a B-spline, 1 + 3k control points
      var d = "M" + e.spline[0].join(",");
      for (var i = 1; i + 2 < e.spline.length; i += 3) {
        d += " C" + e.spline[i].join(",") + " " + e.spline[i + 1].join(",") + " " + e.spline[i + 2].join(",");
      }
      return d;
    }
    return "M" + e.points.map(function (p) { return p.join(","); }).join(" L");
  }

  function showTip(node, ev) {
    tip.textContent = "";
    var head = document.createElement("strong");
    head.textContent = node.name;
    tip.appendChild(head);
    node.hover.forEach(function (line) {
      var div = document.createElement("div");
      div.textContent = line;
      tip.appendChild(div);
    });
    tip.style.left = (ev.pageX + 14) + "px";
    tip.style.top = (ev.pageY + 10) + "px";
    tip.hidden = false;
  }

  function draw(item) {
    var view = item.view;
    if (view.layout === "dagre") { layOut(view); }
    var host = document.getElementById(item.host);
    var pad = 8;
    var svg = el("svg", { "class": "graph", width: view.width + 2 * pad, height: view.height + 2 * pad,
                          viewBox: (-pad) + " " + (-pad) + " " + (view.width + 2 * pad) + " " + (view.height + 2 * pad) }, host);
    var defs = el("defs", {}, svg);
    var marker = el("marker", { id: item.host + "-arrow", viewBox: "0 0 10 10", refX: 9, refY: 5,
                                markerUnits: "userSpaceOnUse", markerWidth: 9, markerHeight: 9,
                                orient: "auto-start-reverse" }, defs);
    el("path", { d: "M0,0 L10,5 L0,10 z", "class": "arrow" }, marker);
    view.edges.forEach(function (e) {
      el("path", { d: edgePath(e), "class": "edge" + (e.path ? " on-path" : ""),
                   "marker-end": "url(#" + item.host + "-arrow)" }, svg);
    });
    view.nodes.forEach(function (n) {
      var cls = ["node", n.cls, n.kind];
      if (n.faulty) { cls.push("faulty"); }
      if (n.path) { cls.push("on-path"); }
      if (n.output) { cls.push("loss"); }
      var g = el("g", { "class": cls.join(" "), "data-node": n.id, transform: "translate(" + n.x + "," + n.y + ")" }, svg);
      el("rect", { x: -n.w / 2, y: -n.h / 2, width: n.w, height: n.h, rx: 5 }, g);
      var name = el("text", { y: -3, "text-anchor": "middle", "class": "name" }, g);
      name.textContent = n.name;
      var op = el("text", { y: 12, "text-anchor": "middle", "class": "op" }, g);
      op.textContent = n.kind === "node" ? n.op : n.kind;
      g.addEventListener("mouseenter", function (ev) { showTip(n, ev); });
      g.addEventListener("mousemove", function (ev) { showTip(n, ev); });
      g.addEventListener("mouseleave", function () { tip.hidden = true; });
    });
    host.setAttribute("data-drawn", view.layout);
    focus(host, view, pad);
    var details = host.closest("details");  // a collapsed graph has no size yet: focus when opened
    if (details) { details.addEventListener("toggle", function () { focus(host, view, pad); }); }
  }

  // Long graphs are far wider or taller than their box (chain_256: its first node ~21,900 px to the
  // right): scroll the box to the faulty node, else the loss, so the first screen shows what matters.
  function focus(host, view, pad) {
    var n = view.nodes.filter(function (m) { return m.faulty; })[0] ||
            view.nodes.filter(function (m) { return m.output; })[0];
    if (!n || !host.clientWidth) { return; }
    host.scrollLeft = Math.max(0, n.x + pad - host.clientWidth / 2);
    host.scrollTop = Math.max(0, n.y + pad - host.clientHeight / 2);
  }

  data.graphs.forEach(function (item) { if (item.view) { draw(item); } });
  document.body.setAttribute("data-ready", "1");
})();
