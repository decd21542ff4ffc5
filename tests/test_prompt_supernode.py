"""`fedorasflwr.launch.supernode`: Flower's SuperNode loop with its waits shortened (issue 44:
a deployment round waited 0-3 s per node before its message was pulled).

The clock's arithmetic by hand (held short for `ACTIVE_HOLD` s after a reply), the patch on
a stand-in of Flower's module (a reply pushed resets the back-off, even when the push
raises), the patch on Flower's real module in a fresh process, and the deployment's choice
of program. The deployment engine tests run every SuperNode this way (`Deployment`'s
default)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from fedorasflwr.backoff import OBJECT_PULL_FIRST_WAIT, PROMPT_MARK
from fedorasflwr.launch import Deployment
from fedorasflwr.launch import supernode as prompt
from fedorasflwr.launch.warm_compat import FlowerInternal, FlowerInternalsError


class FakeClock:
    """Virtual time: ``sleep`` moves it on."""

    def __init__(self) -> None:
        self.slept: list[float] = []
        self.now = 1000.0

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 42.0


def test_idle_waits_are_held_short_after_a_reply_then_grow_to_flowers_own():
    fake = FakeClock()
    clock = prompt.PromptClock(fake)
    while fake.now < 1000.0 + prompt.ACTIVE_HOLD:
        clock.sleep(3)  # Flower's wait after a pull that found nothing
    # within the hold: 0.1, then x1.5 each time, never above HELD_IDLE_WAIT (0.25)
    assert fake.slept[:5] == pytest.approx([0.1, 0.15, 0.225, 0.25, 0.25])
    assert max(fake.slept) == prompt.HELD_IDLE_WAIT == 0.25
    held = len(fake.slept)
    for _ in range(8):
        clock.sleep(3)
    # then x1.5 from there on, never above Flower's 3 s
    expected = [0.25 * 1.5**k for k in range(1, 7)]
    assert fake.slept[held : held + 6] == pytest.approx(expected)
    assert fake.slept[-1] == 3
    clock.sleep(0.5)  # Flower's wait between two checks for the ClientApp's reply
    clock.sleep(0.05)
    assert fake.slept[-2:] == [prompt.REPLY_CHECK, 0.05]
    clock.message_handled()
    clock.sleep(3), clock.sleep(3), clock.sleep(3), clock.sleep(3)
    assert fake.slept[-4:] == pytest.approx([0.1, 0.15, 0.225, 0.25])  # held again
    assert clock.time() == 42.0  # everything else is the real clock's


def test_the_patch_resets_the_back_off_after_every_push_even_a_failed_one():
    pushed: list[tuple] = []

    def push(*args, **kwargs):
        pushed.append((args, kwargs))
        if kwargs.get("fail"):
            raise ConnectionError("SuperLink gone")

    def pull_objects(*args, **kwargs):
        return args, kwargs

    module = SimpleNamespace(time=None, _push_messages=push, pull_objects=pull_objects)
    fake = FakeClock()
    clock = prompt.PromptClock(fake)
    prompt.make_prompt(module, clock)
    assert module.time is clock and module._push_messages.__wrapped__ is push
    # a message's objects missing on the SuperLink are asked for again after 0.05 s
    assert module.pull_objects.func is pull_objects and getattr(module.pull_objects, PROMPT_MARK)
    assert module.pull_objects(["id"])[1]["initial_backoff"] == OBJECT_PULL_FIRST_WAIT
    clock.sleep(3), clock.sleep(3)
    assert fake.slept[-1] > prompt.FIRST_IDLE_WAIT
    module._push_messages(1, state="s")
    assert pushed == [((1,), {"state": "s"})]
    clock.sleep(3)
    assert fake.slept[-1] == prompt.FIRST_IDLE_WAIT
    clock.sleep(3)
    with pytest.raises(ConnectionError):
        module._push_messages(fail=True)
    clock.sleep(3)
    assert fake.slept[-1] == prompt.FIRST_IDLE_WAIT


def test_flowers_supernode_module_takes_the_patch():
    # Flower's own module, in a fresh process: the names exist and the loop's waits go
    # through the clock (its source still calls time.sleep(3) and time.sleep(0.5))
    code = """
import inspect, sys
from fedorasflwr.launch import supernode as prompt
from fedorasflwr.launch.warm_compat import load_flower_internals
load_flower_internals(prompt.SUPERNODE_INTERNALS)
module = sys.modules["flwr.supernode.start_client_internal"]
source = inspect.getsource(module)
assert "time.sleep(3)" in source and "time.sleep(0.5)" in source
prompt.make_prompt(module, prompt.PromptClock())
assert isinstance(module.time, prompt.PromptClock)
assert module.pull_objects.func.__name__ == "pull_objects"
print(module._push_messages.__wrapped__.__name__)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "_push_messages"


def test_moved_internals_are_named_with_the_flower_version():
    moved = (FlowerInternal("flwr.supernode.start_client_internal", "_no_such_loop"),)
    with pytest.raises(FlowerInternalsError, match="the prompt SuperNode needs") as error:
        prompt.load_flower_internals(moved, who="the prompt SuperNode", instead="x")
    assert "_no_such_loop" in str(error.value) and "flwr>=1.41,<1.42" in str(error.value)


def test_the_deployment_starts_prompt_supernodes_unless_told(monkeypatch, tmp_path):
    started: list[list[str]] = []

    def spawn(self, command, name, flwr_home, **_):
        started.append(command)
        return SimpleNamespace(pid=1)

    monkeypatch.setattr(Deployment, "_spawn", spawn)
    for prompt_supernodes in (True, False):
        deployment = Deployment(
            num_supernodes=1,
            insecure=True,
            warm_clientapps=False,
            prompt_supernodes=prompt_supernodes,
        )
        deployment.flwr_home = tmp_path
        deployment.start_supernode("supernode-0", {})
    prompt_command, flower_command = started
    assert prompt_command[1:3] == ["-m", "fedorasflwr.launch.supernode"]
    assert flower_command[0].endswith("flower-supernode")

    def without_port(arguments: list[str]) -> list[str]:  # each start takes a free port
        at = arguments.index("--port")
        return arguments[:at] + arguments[at + 2 :]

    assert without_port(prompt_command[3:]) == without_port(flower_command[1:])


@pytest.mark.parametrize("polling", ["", "flower"])
def test_main_patches_flowers_loop_unless_told_then_runs_flowers_supernode(monkeypatch, polling):
    import flwr.supernode.start_client_internal as loop

    # restored after the test, whatever main does to them
    monkeypatch.setattr(loop, "time", loop.time)
    monkeypatch.setattr(loop, "_push_messages", loop._push_messages)
    monkeypatch.setenv(prompt.POLLING_ENV, polling)
    seen = []

    def flower_supernode():
        seen.append((sys.argv[0], type(loop.time).__name__))
        return 0

    real_load = prompt.load_flower_internals

    def load(internals, **kwargs):
        return {**real_load(internals, **kwargs), "flower_supernode": flower_supernode}

    monkeypatch.setattr(prompt, "load_flower_internals", load)
    monkeypatch.setattr(sys, "argv", ["x"])
    with pytest.raises(SystemExit) as done:
        prompt.main()
    assert done.value.code == 0
    clock = "module" if polling == "flower" else "PromptClock"
    assert seen == [("flower-supernode", clock)]
