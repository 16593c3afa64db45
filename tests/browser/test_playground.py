"""The playground in headless Chromium, step by step as a person would use it, against
the real service with the offline model (which quotes the last message, and calls a
tool for a line `/tool Name {json}`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from playwright.async_api import Locator, expect

from tests.browser.conftest import Playground
from tests.fake_anthropic import FakeAnthropic, items

pytestmark = pytest.mark.browser

ECHO = "Offline model (not a language model). You said: "

# Records every text the reply being streamed shows (a MutationObserver on the log), so
# a test can check what was on screen while it streamed, not only at the end.
RECORD_STREAM = """() => {
  window.__samples = [];
  const log = document.querySelector('#chat-log');
  new MutationObserver(() => {
    for (const el of log.querySelectorAll('article[aria-busy="true"] .blocks > .text')) {
      const text = el.textContent;
      if (window.__samples.at(-1) !== text) window.__samples.push(text);
    }
  }).observe(log, {childList: true, subtree: true, characterData: true});
}"""


async def test_create_a_session_and_stream_a_reply(playground: Playground) -> None:
    ui = playground
    await ui.shot("empty")
    await ui.enter_key()
    await ui.new_session("First steps")
    await expect(ui.page.get_by_role("button", name="First steps")).to_have_attribute(
        "aria-current", "true"
    )
    await ui.shot("created")

    await ui.page.evaluate(RECORD_STREAM)
    await ui.box.fill("/long 400")
    await ui.box.press("Enter")
    streaming = ui.log.locator("article[aria-busy=true]")
    await expect(streaming).to_contain_text("Offline filler sentence 2.")
    await ui.shot("streaming")
    await expect(ui.status).to_have_text("Reply complete")
    reply = ui.messages("Assistant").last
    final = await reply.locator(".text").inner_text()
    assert len(final) == 1600
    samples: list[str] = await ui.page.evaluate("window.__samples")
    assert len(samples) > 5, "the reply appeared in one piece, not streamed"
    assert all(final.startswith(sample) for sample in samples)

    await ui.send("Hello, Parley!")
    await expect(ui.messages("You").last).to_contain_text("Hello, Parley!")
    await expect(ui.messages("Assistant").last).to_contain_text(ECHO + "Hello, Parley!")
    await expect(ui.messages()).to_have_count(4)
    await ui.shot("replied")


async def test_tool_calls_and_thinking_fold_open(playground: Playground) -> None:
    ui = playground
    await ui.enter_key()
    await ui.new_session("Tools", thinking="adaptive")
    await ui.send('/think\nplease write\n/tool Write {"file_path": "notes/a.txt", "content": "hi"}')
    turn = ui.messages("Assistant")
    await expect(turn).to_have_count(2)  # the tool call, then the report on its result

    call = turn.first.locator("details.tool")
    await expect(call).to_contain_text("Tool call Write")
    await expect(call).to_contain_text("done")
    await expect(call).not_to_have_attribute("open", "")
    await expect(call.get_by_text("Created notes/a.txt")).to_be_hidden()
    thinking = turn.first.locator("details.thinking")
    await expect(thinking.get_by_text("Offline thinking")).to_be_hidden()
    await ui.shot("folded")

    await call.locator("summary").click()
    await expect(call.get_by_text('"file_path": "notes/a.txt"')).to_be_visible()
    await expect(call.get_by_text("Created notes/a.txt (2 bytes).")).to_be_visible()
    await thinking.locator("summary").click()
    await expect(thinking.get_by_text("Offline thinking")).to_be_visible()
    await expect(turn.last).to_contain_text('First line: "Created notes/a.txt (2 bytes)."')
    files = ui.page.get_by_role("list", name="Workspace files")
    await expect(files).to_contain_text("notes/a.txt")
    await ui.shot("unfolded")


async def test_a_client_tool_is_answered_from_the_page(playground: Playground) -> None:
    ui = playground
    await ui.enter_key()
    await ui.new_session("Client tool", client_tool=True)
    await ui.send(
        'Which colour?\n/tool ask_user {"question": "Favourite colour?"}',
        until="The model called ask_user: answer it in the conversation",
    )
    call = ui.log.locator("details.tool")
    await expect(call).to_have_attribute("open", "")
    await expect(call).to_contain_text("waiting for your answer")
    await expect(call).to_contain_text("Favourite colour?")
    await expect(ui.page.get_by_role("button", name="Send", exact=True)).to_be_disabled()
    await expect(ui.page.get_by_role("button", name="Cancel", exact=True)).to_be_enabled()
    await ui.shot("asked")

    answer = ui.page.get_by_role("textbox", name="Result for ask_user")
    await answer.fill("blue")
    await ui.page.get_by_role("button", name="Send result").click()
    await expect(ui.status).to_have_text("Reply complete")
    await expect(ui.messages("Assistant").last).to_contain_text('First line: "blue"')
    await expect(call).to_contain_text("done")
    await ui.shot("answered")

    # Runs: the turn with its usage, and its raw events in the inspector, replayable.
    runs = ui.page.locator("table.runs tbody tr")
    await expect(runs).to_have_count(1)
    await expect(runs.first).to_contain_text("completed")
    input_tokens = await runs.first.locator("td.num").first.inner_text()
    assert int(input_tokens.replace(",", "")) > 0
    await runs.first.get_by_role("button", name="Events of run").click()
    raw = ui.page.get_by_label("Raw events")
    await expect(raw).to_contain_text("event: run.requires_action")
    await expect(raw).to_contain_text("event: run.completed")
    await expect(ui.page.locator(".inspector-view")).to_contain_text("(the run has settled)")
    await ui.shot("events")
    text = await raw.inner_text()
    ids = [int(line[4:]) for line in text.splitlines() if line.startswith("id: ")]
    assert ids == list(range(1, len(ids) + 1))
    await ui.page.get_by_label("Replay after event id").fill(str(ids[-3]))
    await ui.page.get_by_role("button", name="Replay", exact=True).click()
    await expect(ui.page.locator(".inspector-view")).to_contain_text("2 events (the run")
    await expect(raw).not_to_contain_text("event: run.started")
    await ui.shot("replayed")


def versions(message: Locator) -> Locator:
    """The "2 of 3" of a message that has other versions (edits, regenerations)."""
    return message.get_by_role("group", name="Versions").locator(".count")


async def test_edit_regenerate_and_move_between_siblings(playground: Playground) -> None:
    ui = playground
    await ui.enter_key()
    await ui.new_session("Branches")
    await ui.send("first question")
    await ui.send("second question")
    await expect(ui.messages()).to_have_count(4)

    first = ui.messages("You").first
    await first.get_by_role("button", name="Edit").click()
    await first.get_by_role("textbox", name="Edited message").fill("first question, reworded")
    await ui.shot("editing")
    await first.get_by_role("button", name="Save and send").click()
    await expect(ui.status).to_have_text("Reply complete")
    await expect(ui.messages()).to_have_count(2)
    await expect(ui.messages("You").first).to_contain_text("first question, reworded")
    await expect(versions(ui.messages("You").first)).to_have_text("2 of 2")
    await expect(ui.messages("Assistant").last).to_contain_text(ECHO + "first question, reworded")
    await ui.shot("edited")

    await ui.messages("You").first.get_by_role("button", name="Previous version").click()
    await expect(ui.messages()).to_have_count(4)
    await expect(ui.messages("You").first).to_contain_text("first question")
    await expect(versions(ui.messages("You").first)).to_have_text("1 of 2")
    await expect(ui.messages("You").last).to_contain_text("second question")
    await ui.shot("previous-version")

    await ui.messages("Assistant").last.get_by_role("button", name="Regenerate").click()
    await expect(ui.status).to_have_text("Reply complete")
    last = ui.messages("Assistant").last
    await expect(versions(last)).to_have_text("2 of 2")
    await expect(last).to_contain_text(ECHO + "second question")
    await last.get_by_role("button", name="Previous version").click()
    await expect(versions(ui.messages("Assistant").last)).to_have_text("1 of 2")
    await ui.shot("regenerated")

    # The tree as an outline: the edit and the regeneration are two forks.
    outline = ui.page.get_by_role("group", name="Message tree")
    await expect(outline.locator("li.fork")).to_have_count(2)
    await expect(outline.get_by_role("button")).to_have_count(7)

    # Rewind the head to the first reply: the conversation ends there.
    await ui.messages("Assistant").first.get_by_role("button", name="Rewind to here").click()
    await expect(ui.messages()).to_have_count(2)
    await expect(ui.status).to_have_text("Rewound: the next turn continues from this message")
    await ui.shot("rewound")


async def test_sessions_search_rename_fork_and_delete(playground: Playground) -> None:
    ui = playground
    await ui.enter_key()
    await ui.new_session("Alpha notes")
    await ui.send("remember alpha")
    await ui.new_session("Beta notes")
    sessions = ui.page.get_by_role("navigation", name="Sessions")
    search = ui.page.get_by_role("searchbox", name="Search sessions")
    await search.fill("alpha")
    await expect(sessions.get_by_role("button", name="Alpha notes")).to_be_visible()
    await expect(sessions.get_by_role("button", name="Beta notes")).to_be_hidden()
    await ui.shot("searched")
    await search.fill("")

    await sessions.get_by_role("button", name="Alpha notes").click()
    await expect(ui.messages()).to_have_count(2)
    await ui.page.get_by_role("button", name="Rename").click()
    await ui.page.get_by_label("Session title").fill("Alpha, renamed")
    await ui.page.get_by_role("button", name="Save title").click()
    await expect(ui.title).to_have_text("Alpha, renamed")
    await expect(sessions.get_by_role("button", name="Alpha, renamed")).to_be_visible()

    await ui.page.get_by_role("button", name="Fork", exact=True).click()
    await expect(ui.title).to_have_text("Fork of Alpha, renamed")
    await expect(ui.messages()).to_have_count(2)
    await expect(ui.messages("You").first).to_contain_text("remember alpha")
    await ui.shot("forked")

    await ui.page.get_by_role("button", name="Delete", exact=True).click()
    confirm = ui.page.get_by_role("dialog")
    await expect(confirm).to_contain_text("Fork of Alpha, renamed")
    await confirm.get_by_role("button", name="Yes, delete").click()
    await expect(ui.status).to_have_text("Deleted")
    await expect(sessions.get_by_role("button", name="Fork of Alpha, renamed")).to_have_count(0)
    await expect(sessions.get_by_role("button", name="Alpha, renamed")).to_be_visible()
    await ui.shot("deleted")


async def test_compact_and_unfold_the_summary(playground: Playground) -> None:
    ui = playground
    await ui.enter_key()
    # Micro-compaction at once, keeping no old result: older tool results are cleared. A
    # low threshold makes the context meter show something; the written file is long enough
    # that a summary makes the context smaller (compaction refuses to grow it).
    await ui.new_session(
        "Compaction",
        fields={
            "Keep recent tool results": "0",
            "Micro batch tokens": "0",
            "Threshold tokens": "20000",
        },
    )
    colours = "\\n".join(f"line {i}: red, green, blue" for i in range(400))
    await ui.send(f'/tool Write {{"file_path": "colours.txt", "content": "{colours}"}}')
    await ui.send('/tool Read {"file_path": "colours.txt"}')
    await ui.send("which colours were written?")
    meter = ui.page.get_by_role("meter", name="Context used before auto-compaction")
    await expect(meter).to_be_visible()
    await expect(ui.page.locator("#context-body")).to_contain_text(
        "of 20,000 tokens before auto-compaction"
    )
    assert int(await meter.get_attribute("aria-valuenow") or 0) > 0
    # The Read result (large, and no longer the newest) is cleared from the model's view.
    read = ui.log.locator("details.tool", has_text="Tool call Read")
    await expect(read).to_contain_text("cleared from the model's view")
    await ui.shot("cleared")

    await ui.page.get_by_label("Compaction instructions (optional)").fill("keep the colours")
    await ui.page.get_by_role("button", name="Compact", exact=True).click()
    await expect(ui.status).to_contain_text("Compacted")
    boundary = ui.log.get_by_role("separator", name="Compaction boundary")
    await expect(boundary).to_contain_text("Compacted (manual)")
    await expect(boundary).to_contain_text("keep the colours")
    summary = ui.log.locator("details.summary")
    await expect(summary.get_by_text("Primary Request and Intent")).to_be_hidden()
    await ui.shot("compacted")
    await summary.locator("summary").click()
    await expect(summary.get_by_text("Primary Request and Intent")).to_be_visible()
    await expect(ui.page.locator("#context-body")).to_contain_text("Last compaction (manual)")
    await ui.shot("summary-unfolded")

    # The model's view starts at the summary; the full history still holds everything.
    await ui.page.get_by_label("Model's view").check()
    await expect(ui.log).to_contain_text("The model's view")
    await expect(ui.log.get_by_role("separator", name="Compaction boundary")).to_have_count(0)
    await expect(ui.log.locator("details.summary")).to_have_count(1)
    await expect(ui.log.locator("details.tool", has_text="Tool call Write")).to_have_count(0)
    await ui.shot("model-view")
    await ui.page.get_by_label("Full history").check()
    await expect(ui.log.locator("details.tool", has_text="Tool call Write")).to_have_count(1)


async def test_upload_a_file_and_read_it_through_a_tool(playground: Playground) -> None:
    ui = playground
    await ui.enter_key()
    await ui.new_session("Upload and read")
    await ui.page.get_by_label("File to upload").set_input_files(
        files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": b"alpha\nbeta\n"}]
    )
    await ui.page.get_by_role("button", name="Upload", exact=True).click()
    await expect(ui.status).to_have_text("Uploaded notes.txt")
    files = ui.page.get_by_role("list", name="Workspace files")
    await expect(files).to_contain_text("notes.txt")
    await files.get_by_role("button", name="View notes.txt").click()
    await expect(ui.page.get_by_role("region", name="Content of notes.txt")).to_contain_text(
        "alpha\nbeta"
    )
    await ui.shot("uploaded")

    await ui.send('/tool Read {"file_path": "notes.txt"}')
    call = ui.log.locator("details.tool")
    await call.locator("summary").click()
    await expect(call.locator("pre.result")).to_contain_text("alpha")
    await expect(call.locator("pre.result")).to_contain_text("beta")
    await expect(ui.messages("Assistant").last).to_contain_text("Tool Read returned 2 lines.")
    await ui.shot("read-back")

    await files.get_by_role("button", name="Delete notes.txt").click()
    await ui.page.get_by_role("button", name="Yes, delete").click()
    await expect(ui.status).to_have_text("Deleted notes.txt")
    await expect(ui.page.locator("#files-body")).to_contain_text("No files.")


async def test_a_dropped_connection_resumes_without_repeating_text(
    playground: Playground,
) -> None:
    ui = playground
    await ui.enter_key()
    await ui.new_session("Network drop")
    await ui.page.evaluate(RECORD_STREAM)
    await ui.box.fill("/long 600")
    await ui.box.press("Enter")
    streaming = ui.log.locator("article[aria-busy=true] .blocks > .text")
    await expect(streaming).to_contain_text("Offline filler sentence 8.")

    await ui.page.context.set_offline(True)
    await expect(ui.status).to_contain_text("Offline")
    cut = len(await streaming.inner_text())
    await ui.shot("offline")
    await asyncio.sleep(0.6)  # the reply goes on at the service meanwhile
    await ui.page.context.set_offline(False)
    await expect(ui.status).to_have_text("Reply complete")
    await ui.shot("resumed")

    session = await ui.session_id()
    async with ui.api() as api:
        chain = (await api.get(f"/sessions/{session}/messages")).json()["data"]
    stored = chain[-1]["content"][0]["text"]
    assert len(stored) == 2400
    shown = await ui.messages("Assistant").last.locator(".text").inner_text()
    assert shown == stored
    assert shown.count("Offline filler sentence 1. ") == 1
    samples: list[str] = await ui.page.evaluate("window.__samples")
    assert all(stored.startswith(sample) for sample in samples), "text repeated or lost"
    assert any(len(sample) > cut for sample in samples), "the stream did not resume"


async def test_a_reload_picks_up_the_running_reply(playground: Playground) -> None:
    ui = playground
    await ui.enter_key()
    await ui.new_session("Reload")
    await ui.box.fill("/long 800")
    await ui.box.press("Enter")
    await expect(ui.log.locator("article[aria-busy=true]")).to_contain_text("sentence 5.")
    await ui.page.reload()  # the API key and the session come back from the tab's storage
    await expect(ui.title).to_have_text("Reload")
    await expect(ui.log.locator("article[aria-busy=true]")).to_be_visible()
    await ui.shot("reloaded")
    await expect(ui.status).to_have_text("Reply complete")
    shown = await ui.messages("Assistant").last.locator(".text").inner_text()
    assert len(shown) == 3200
    assert shown.count("Offline filler sentence 1. ") == 1


async def test_cancel_and_keyboard_on_a_phone_width_screen(playground: Playground) -> None:
    ui = playground
    await ui.page.set_viewport_size({"width": 390, "height": 844})
    await ui.enter_key()
    await ui.new_session("Phone")
    width = await ui.page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page is {width}px wide on a 390px screen"

    # Shift+Enter makes a new line, Enter sends.
    await ui.box.focus()
    await ui.page.keyboard.type("line one")
    await ui.page.keyboard.press("Shift+Enter")
    await ui.page.keyboard.type("line two")
    await ui.page.keyboard.press("Enter")
    await expect(ui.status).to_have_text("Reply complete")
    await expect(ui.messages("You").last.locator(".text")).to_have_text("line one\nline two")
    for name in ("New session", "Send", "Cancel", "Compact", "Regenerate", "Edit", "Fork"):
        await expect(ui.page.get_by_role("button", name=name, exact=True).first).to_be_attached()
    await ui.shot("phone")

    await ui.send("/long 4000", until="The model is replying…")
    await expect(ui.log.locator("article[aria-busy=true]")).to_be_visible()
    await ui.page.get_by_role("button", name="Cancel", exact=True).click()
    await expect(ui.status).to_have_text("Cancelled")
    await expect(ui.page.locator("table.runs tbody tr").first).to_contain_text("cancelled")
    await ui.shot("cancelled")


async def test_a_discarded_partial_reply_gives_way_to_the_retry(
    anthropic_playground: Playground, fake: FakeAnthropic
) -> None:
    """On the Anthropic provider (the real SDK against the fake API): the model's stream
    breaks after some text, the service retries, and the page drops the partial reply
    (`message.discarded`) instead of running the retry's text on after it."""
    ui = anthropic_playground
    await expect(ui.page.locator("#provider")).to_contain_text("Anthropic")
    await ui.enter_key()
    await ui.new_session("Retried reply")
    fake.script(items.drop(6, "partial text that will be lost"), "the whole reply")
    await ui.page.evaluate(RECORD_STREAM)
    await ui.send("hello")
    await expect(ui.messages("Assistant")).to_have_count(1)
    await expect(ui.messages("Assistant").locator(".text")).to_have_text("the whole reply")
    await expect(ui.log).to_contain_text("A partial reply was discarded")
    await ui.shot("retried")
    samples: list[str] = await ui.page.evaluate("window.__samples")
    assert any(sample.startswith("partial") for sample in samples), samples
    assert not any("partial" in sample and "whole" in sample for sample in samples), samples


@pytest.mark.parametrize("arrived", [True, False], ids=["answer-lost", "request-lost"])
async def test_tool_results_cut_off_on_the_way_are_sent_again(
    playground: Playground, arrived: bool
) -> None:
    """The connection drops after the service took the results (the answer is lost) or
    before (the request is): the page sends them again, and the service, which accepts
    them once, answers as it did the first time or takes them now."""
    ui = playground
    await ui.enter_key()
    await ui.new_session("Cut off", client_tool=True)
    await ui.send(
        '/tool ask_user {"question": "Favourite colour?"}',
        until="The model called ask_user: answer it in the conversation",
    )
    posts: list[int] = []

    async def cut_the_first(route: Any) -> None:
        posts.append(len(posts))
        if len(posts) > 1:
            await route.continue_()
            return
        if arrived:
            await route.fetch()  # the service stores the results and runs on
        await route.abort("connectionreset")

    await ui.page.route("**/tool_results", cut_the_first)
    await ui.page.get_by_role("textbox", name="Result for ask_user").fill("green")
    await ui.page.get_by_role("button", name="Send result").click()
    await expect(ui.status).to_have_text("Reply complete")
    await expect(ui.messages("Assistant").last).to_contain_text('First line: "green"')
    assert len(posts) == 2
    session = await ui.session_id()
    async with ui.api() as api:
        chain = (await api.get(f"/sessions/{session}/messages")).json()["data"]
    results = [m for m in chain if m["content"][0]["type"] == "tool_result"]
    assert len(results) == 1


async def test_a_browser_token_opens_its_session(playground: Playground) -> None:
    """A page given a browser token instead of the tenant's key opens the token's session
    (it may not list the others) and talks there."""
    ui = playground
    async with ui.api() as api:
        sid = (await api.post("/sessions", json={"title": "Token chat"})).json()["id"]
        minted = await api.post("/tokens", json={"session_id": sid})
        token = minted.json()["token"]
    key = ui.page.get_by_label("API key")
    await key.fill(token)
    await key.press("Enter")
    await expect(ui.page.get_by_role("heading", name="Token chat", exact=True)).to_be_visible()
    assert await ui.session_id() == sid
    await ui.send("Hello through a token")
    await expect(ui.messages("Assistant").last).to_contain_text(ECHO + "Hello through a token")
    await ui.shot("token-chat")
