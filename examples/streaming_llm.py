"""An LLM-style streaming worker: an ``async def`` task streams tokens as it makes them, and
a client follows the job and prints them as they arrive.

    plunder worker -A streaming_llm:app          # in this directory, PLUNDER_URL set
    python streaming_llm.py "tell me a story"

The task has an explicit ``name`` so that this file, run as a script (``__main__``), and the
worker, which imports it as ``streaming_llm``, agree on it.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator

import plunder

app = plunder.App()  # PLUNDER_URL, or sqlite:///plunder.db


def tokens_for(prompt: str) -> Iterator[str]:
    """A stand-in for a model: answers with the prompt's words, backwards."""
    for word in reversed(prompt.split()):
        yield word + " "


@app.task(name="llm.complete", queue="llm", timeout=60, retries=1, retry_on_lost=False)
async def complete(ctx: plunder.Context, prompt: str) -> str:
    answer = []
    for token in tokens_for(prompt):
        await asyncio.sleep(0.02)  # the model thinking, without blocking the worker's loop
        ctx.stream(token)  # followers see it within about 50 ms
        answer.append(token)
    return "".join(answer).strip()


def follow(prompt: str) -> str:
    """Enqueue a completion, print its tokens as they stream in, return the result."""
    job = complete.enqueue(prompt)
    for event in job.stream(timeout=60):
        if event.kind == "attempt":  # a retry starts: what was printed belongs to the last
            print(f"\n[attempt {event.attempt}]", flush=True)
        elif event.kind == "chunk":
            print(event.data, end="", flush=True)
    print()
    return str(job.result(timeout=60))


if __name__ == "__main__":
    print("result:", follow(" ".join(sys.argv[1:]) or "tell me a story"))
