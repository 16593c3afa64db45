"""GET /: a one-page playground to try a session by hand (no build step, no key needed
to load it; the page asks for a key when the service has them)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(tags=["operations"])

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Parley playground</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:15px/1.45 system-ui,sans-serif;max-width:860px;margin:2rem auto;padding:0 1rem;color:#222}
textarea,input{width:100%;box-sizing:border-box;font:inherit;padding:.4rem}
button{font:inherit;padding:.35rem .9rem;margin:.3rem .3rem 0 0}
#log{white-space:pre-wrap;border:1px solid #ccc;border-radius:6px;padding:.7rem;min-height:8rem}
.u{color:#0a5}.a{color:#024}.t{color:#a60}.e{color:#b00}small{color:#666}
</style></head><body>
<h1>Parley playground</h1>
<p><small>Creates a session with the built-in workspace tools and streams replies over SSE.
With the offline model, write <code>/tool Write {"file_path": "a.txt", "content": "hi"}</code>
on a line of its own to make it call a tool.</small></p>
<label>API key (leave empty when the service runs open)<input id="key" type="password"></label>
<p><button id="new">New session</button><small id="sid"></small></p>
<textarea id="msg" rows="3" placeholder="Say something"></textarea>
<button id="send">Send</button><button id="compact">Compact</button>
<div id="log"></div>
<script>
let session = null;
const $ = (id) => document.getElementById(id);
const headers = () => {
  const h = {"Content-Type": "application/json"};
  if ($("key").value) h["Authorization"] = "Bearer " + $("key").value;
  return h;
};
const line = (cls, text) => {
  const s = document.createElement("div"); s.className = cls; s.textContent = text;
  $("log").appendChild(s); return s;
};
$("new").onclick = async () => {
  const r = await fetch("/sessions", {method: "POST", headers: headers(),
    body: JSON.stringify({title: "playground", builtin_tools: ["Read","Write","Edit","Glob","Grep"]})});
  const body = await r.json();
  if (!r.ok) { line("e", body.detail); return; }
  session = body.id; $("sid").textContent = " session " + session; $("log").textContent = "";
};
$("send").onclick = async () => {
  if (!session) await $("new").onclick();
  const text = $("msg").value; if (!text.trim()) return;
  line("u", "you: " + text); $("msg").value = "";
  const r = await fetch(`/sessions/${session}/messages`, {method: "POST", headers: headers(),
    body: JSON.stringify({content: text, stream: true})});
  if (!r.ok) { line("e", (await r.json()).detail); return; }
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "", current = null;
  for (;;) {
    const {value, done} = await reader.read(); if (done) break;
    buf += value;
    let cut;
    while ((cut = buf.search(/\\r?\\n\\r?\\n/)) >= 0) {
      const chunk = buf.slice(0, cut); buf = buf.slice(cut).replace(/^\\r?\\n\\r?\\n/, "");
      let event = "message", data = "";
      for (const l of chunk.split(/\\r?\\n/)) {
        if (l.startsWith("event:")) event = l.slice(6).trim();
        else if (l.startsWith("data:")) data += l.slice(5).trim();
      }
      if (!data) continue;
      const d = JSON.parse(data);
      if (event === "message.started") current = line("a", "assistant: ");
      else if (event === "text.delta" && current) current.textContent += d.text;
      else if (event === "tool_use") line("t", `tool ${d.name}(${JSON.stringify(d.input)})`);
      else if (event === "tool_result") line("t", "result: " + String(d.content).slice(0, 300));
      else if (event === "message.discarded" && current) current.remove();
      else if (event === "run.failed") line("e", "failed: " + d.error.message);
      else if (event.startsWith("compaction.")) line("t", event + " " + JSON.stringify(d));
    }
  }
};
$("compact").onclick = async () => {
  if (!session) return;
  const r = await fetch(`/sessions/${session}/compact`, {method: "POST", headers: headers(), body: "{}"});
  const body = await r.json();
  line(r.ok ? "t" : "e", r.ok ? `compacted: ${body.pre_tokens} -> ${body.post_tokens} tokens` : body.detail);
};
</script></body></html>
"""


@router.get(
    "/", response_class=HTMLResponse, include_in_schema=False, summary="Open the playground"
)
async def playground() -> HTMLResponse:
    """A small HTML page for trying the API from a browser (not part of the OpenAPI
    document)."""
    return HTMLResponse(PAGE)
