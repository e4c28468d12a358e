"""A driver for the official MCP Python SDK, for tests/mcp.rs.

It reads one JSON command per line on stdin and runs each at once (concurrently with those
still running), writing one JSON answer per line on stdout, tagged with the command's `tag`:

  {"tag": T, "op": "call", "url": URL, "mode": MODE, "tool": NAME, "args": {...},
   "meta": {...}?, "timeout": SECONDS?, "session": NAME?}
      -> {"tag": T, "ok": true, "result": <the CallToolResult as JSON>, "protocol": VERSION}
      or {"tag": T, "ok": false, "error": "<what the SDK raised>"}
      Without `session`, the call runs on a client of its own (a new connection: initialize
      or discover, the call, close). With `session`, on the client opened by "open".
  {"tag": T, "op": "open", "session": NAME, "url": URL, "mode": MODE}
  {"tag": T, "op": "close", "session": NAME}
  {"tag": T, "op": "list", "url": URL, "mode": MODE}
      -> {"tag": T, "ok": true, "tools": [...], "protocol": VERSION, "server": {...}}

Instead of "url", a command may name "command": [PROGRAM, ARGS...], a server the SDK launches
and speaks to over stdio.

MODE is the SDK's `mode`: "legacy" (the initialize handshake: 2025-11-25), or a modern
protocol version ("2026-07-28": no handshake, per-request metadata).

The first line it writes is {"tag": "ready", "mcp": "<SDK version>"}. It ends when stdin
closes.
"""

import asyncio
import contextlib
import importlib.metadata
import json
import logging
import sys

from mcp import Client
from mcp.client.stdio import StdioServerParameters


# rmcp answers a session's DELETE with 202 Accepted, which this SDK logs as a failed session
# termination; the session is ended all the same. Keep the test output readable.
logging.getLogger("mcp.client.streamable_http").setLevel(logging.ERROR)


def dump(result):
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


def say(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


sessions = {}


def server_of(cmd):
    """A URL (Streamable HTTP), or {"command": [...]} for a server launched over stdio."""
    if "command" in cmd:
        program, *args = cmd["command"]
        return StdioServerParameters(command=program, args=args)
    return cmd["url"]


async def with_client(cmd, work):
    client = Client(server_of(cmd), mode=cmd["mode"], read_timeout_seconds=cmd.get("timeout", 20))
    stack = contextlib.AsyncExitStack()
    try:
        await stack.enter_async_context(client)
        return await work(client)
    finally:
        # Closing a client whose connection was cut may fail too: that is not the answer.
        with contextlib.suppress(BaseException):
            await stack.aclose()


async def handle(cmd):
    tag = cmd.get("tag")
    op = cmd["op"]
    try:
        if op == "call":

            async def call(client):
                result = await client.call_tool(
                    cmd["tool"],
                    cmd.get("args", {}),
                    meta=cmd.get("meta"),
                    read_timeout_seconds=cmd.get("timeout", 20),
                )
                return {"result": dump(result), "protocol": client.protocol_version}

            if "session" in cmd:
                out = await call(sessions[cmd["session"]][0])
            else:
                out = await asyncio.wait_for(with_client(cmd, call), cmd.get("timeout", 20) + 10)
            say({"tag": tag, "ok": True, **out})
        elif op == "list":

            async def listing(client):
                tools = await client.list_tools()
                return {
                    "tools": [dump(t) for t in tools.tools],
                    "protocol": client.protocol_version,
                }

            say({"tag": tag, "ok": True, **(await with_client(cmd, listing))})
        elif op == "open":
            client = Client(server_of(cmd), mode=cmd["mode"], read_timeout_seconds=cmd.get("timeout", 20))
            stack = contextlib.AsyncExitStack()
            await stack.enter_async_context(client)
            sessions[cmd["session"]] = (client, stack)
            say({"tag": tag, "ok": True, "protocol": client.protocol_version})
        elif op == "close":
            _, stack = sessions.pop(cmd["session"])
            with contextlib.suppress(BaseException):
                await stack.aclose()
            say({"tag": tag, "ok": True})
        else:
            say({"tag": tag, "ok": False, "error": f"unknown op {op!r}"})
    except BaseException as e:  # noqa: BLE001 - every failure is an answer
        say({"tag": tag, "ok": False, "error": f"{type(e).__name__}: {e}"})


async def main():
    say({"tag": "ready", "mcp": importlib.metadata.version("mcp")})
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks = set()
    while True:
        line = await reader.readline()
        if not line:
            break
        if not line.strip():
            continue
        task = asyncio.create_task(handle(json.loads(line)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=30)


asyncio.run(main())
