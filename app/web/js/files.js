// The session's workspace: the files the built-in tools read and write.

import { api, headers, problemOf } from "./api.js";
import { $, h, fill, num, when } from "./dom.js";

const encodePath = (path) => path.split("/").map(encodeURIComponent).join("/");

export class FilesPanel {
  constructor({ confirm, onError, announce }) {
    this.root = $("#files-body");
    this.viewer = $("#file-view");
    this.confirm = confirm;
    this.onError = onError;
    this.announce = announce;
    this.sessionId = null;
    this.items = [];
    this.cursor = null;
    $("#upload-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.upload().catch(onError);
    });
  }

  base() {
    return `/sessions/${this.sessionId}/files`;
  }

  async load(sessionId) {
    this.sessionId = sessionId;
    $("#upload").disabled = !sessionId;
    if (!sessionId) {
      fill(this.root, h("p", { class: "note" }, "No session."));
      fill(this.viewer);
      return;
    }
    this.items = [];
    this.cursor = null;
    await this.more();
  }

  async more() {
    const query = new URLSearchParams({ limit: "50" });
    if (this.cursor) query.set("after", this.cursor);
    const page = await api("GET", `${this.base()}?${query}`);
    this.items.push(...page.data);
    this.cursor = page.next_cursor;
    this.draw();
  }

  draw() {
    fill(
      this.root,
      this.items.length
        ? h(
            "ul",
            { class: "files", "aria-label": "Workspace files" },
            this.items.map((f) =>
              h(
                "li",
                { dataset: { path: f.path } },
                h("span", { class: "path" }, f.path),
                h("span", { class: "note" }, `${num(f.size)} bytes · ${when(f.updated_at)}`),
                h(
                  "span",
                  { class: "row" },
                  h(
                    "button",
                    {
                      type: "button",
                      "aria-label": `View ${f.path}`,
                      onclick: () => this.view(f).catch(this.onError),
                    },
                    "View",
                  ),
                  h(
                    "button",
                    {
                      type: "button",
                      class: "danger",
                      "aria-label": `Delete ${f.path}`,
                      onclick: () => this.remove(f).catch(this.onError),
                    },
                    "Delete",
                  ),
                ),
              ),
            ),
          )
        : h("p", { class: "note" }, "No files. Upload one, or let the Write tool create some."),
      this.cursor
        ? h("button", { type: "button", onclick: () => this.more().catch(this.onError) }, "More files")
        : null,
    );
  }

  async view(file) {
    const response = await fetch(`${this.base()}/${encodePath(file.path)}`, { headers: headers() });
    if (!response.ok) throw await problemOf(response);
    const bytes = new Uint8Array(await response.arrayBuffer());
    const binary = bytes.includes(0);
    const text = binary ? `(${num(bytes.length)} bytes of binary data)` : new TextDecoder().decode(bytes);
    fill(
      this.viewer,
      h(
        "section",
        { class: "file-view", "aria-label": `Content of ${file.path}` },
        h(
          "header",
          { class: "row" },
          h("strong", {}, file.path),
          h("span", { class: "note" }, `sha256 ${file.sha256.slice(0, 12)}…`),
          h("button", { type: "button", onclick: () => fill(this.viewer) }, "Close file"),
        ),
        h("pre", { class: "file-content" }, text),
      ),
    );
  }

  async remove(file) {
    if (!(await this.confirm(`Delete ${file.path} from the workspace?`))) return;
    await api("DELETE", `${this.base()}/${encodePath(file.path)}`);
    this.announce(`Deleted ${file.path}`);
    fill(this.viewer);
    await this.load(this.sessionId);
  }

  async upload() {
    const input = $("#upload-file");
    const file = input.files?.[0];
    if (!file) {
      this.announce("Choose a file to upload first");
      return;
    }
    const path = $("#upload-path").value.trim() || file.name;
    await api("PUT", `${this.base()}/${encodePath(path)}`, {
      body: file,
      headers: { "Content-Type": "application/octet-stream" },
    });
    input.value = "";
    $("#upload-path").value = "";
    this.announce(`Uploaded ${path}`);
    await this.load(this.sessionId);
  }
}
