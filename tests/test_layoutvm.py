"""The compiled body decoder (decoder/_layoutvm.c) against its Python reference (decoder.codegen).

Real captures decode to the same rows either way, every body they hold decodes to the same fields
(records summaries with their batch entries included) without the C loop handing a frame back to
the reference, and mutated bodies give the same fields or the same exception either way.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from decoder import codegen, protocol
from decoder.records import RecordsSummary
from kwire.decode_command import decode_captures

REPO = Path(__file__).resolve().parents[1]
CAPTURES = sorted(
    [
        *REPO.glob("captures/*.pcap"),
        *REPO.glob("captures/lab/**/capture.pcap*"),
        *REPO.glob(".cache/bench/chatty.pcap"),
    ]
)

pytestmark = pytest.mark.skipif(codegen._layoutvm is None, reason="KWIRE_PURE_PYTHON=1: no compiled decoder")


def _plain(value: Any) -> Any:
    """Fields as comparable values: a RecordsSummary with its entries, which == alone ignores."""
    if type(value) is RecordsSummary:
        return ("RecordsSummary", tuple(value), _plain(value.entries))
    if type(value) is dict:
        return {key: _plain(item) for key, item in value.items()} | {"__order__": tuple(value)}
    if type(value) in (list, tuple):
        return type(value)(_plain(item) for item in value)
    return value


def _outcome(fn: Any, buf: Any, pos: int = 0, end: int | None = None) -> Any:
    try:
        fields, stop = fn(buf, pos, len(buf) if end is None else end)
    except Exception as exc:  # the reference's exception is the decoder's answer
        return ("raised", type(exc), str(exc))
    return ("ok", _plain(fields), stop)


class _Recorder:
    """Stands in for ``protocol._decoder`` and keeps every body decoded, with its decoder."""

    def __init__(self) -> None:
        self.bodies: dict[tuple[int, bytes], Any] = {}
        self.inner = protocol._decoder

    def __call__(self, direction: str, api_key: int, api_version: int) -> Any:
        fn = self.inner(direction, api_key, api_version)
        if fn is None:
            return None

        def decode(buf: Any, pos: int, end: int) -> Any:
            self.bodies.setdefault((id(fn), bytes(buf[pos:end])), fn)
            return fn(buf, pos, end)

        return decode


def _fresh_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol, "_compiled", {})
    monkeypatch.setattr(protocol, "_request_plans", {})
    monkeypatch.setattr(protocol, "_response_plans", {})


def _rows(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    exchanges: list[dict[str, Any]] = []
    connections: list[dict[str, Any]] = []
    decode_captures([path], exchanges.append, connections.append)
    return exchanges, connections


@pytest.fixture(scope="module")
def bodies() -> list[tuple[Any, bytes]]:
    """Every distinct body of every capture, with the compiled decoder that read it."""
    with pytest.MonkeyPatch.context() as mp:
        _fresh_tables(mp)
        recorder = _Recorder()
        mp.setattr(protocol, "_decoder", recorder)
        for path in CAPTURES:
            _rows(path)
    return [(fn, body) for (_, body), fn in recorder.bodies.items()]


def test_captures_are_there() -> None:
    assert len([p for p in CAPTURES if "lab" in p.parts]) >= 5
    assert any(p.name == "tansu-mixed.pcap" for p in CAPTURES)


def test_message_decoders_are_compiled() -> None:
    fn = protocol.request_decoder(0, 9)
    assert type(fn).__module__ == "decoder._layoutvm" or type(fn).__name__ == "Decoder"
    assert fn.reference.__name__.startswith("_d")


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: str(p.relative_to(REPO)))
def test_rows_identical_with_and_without_the_compiled_decoder(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fresh_tables(monkeypatch)
    compiled = _rows(path)
    _fresh_tables(monkeypatch)
    monkeypatch.setattr(protocol, "compile_message", codegen.compile_python)
    reference = _rows(path)
    assert type(protocol.request_decoder(0, 9)).__name__ == "function"
    assert len(compiled[0]) == len(reference[0]) > 0
    assert compiled == reference


def test_every_captured_body_decodes_the_same_without_falling_back(bodies: list[tuple[Any, bytes]]) -> None:
    assert len(bodies) > 1000
    differ = [
        (fn.reference.__name__, body.hex()[:80])
        for fn, body in bodies
        if _outcome(fn, body) != _outcome(fn.reference, body)
    ]
    assert differ == []
    ok = [(fn, body) for fn, body in bodies if _outcome(fn.reference, body)[0] == "ok"]
    assert len(ok) > 1000
    # bodies the reference decodes are decoded by the C loop itself (fallbacks only for bad ones)
    for fn, body in ok:
        n = fn.fallbacks
        fn(body, 0, len(body))
        assert fn.fallbacks == n, fn.reference.__name__


def test_mutated_bodies_decode_the_same(bodies: list[tuple[Any, bytes]]) -> None:
    """Bytes changed, lengths and counts made huge, negative or zero, bodies cut short: the same
    fields or the same exception either way (and no crash)."""
    rng = random.Random(22)
    seen: dict[tuple[int, int], tuple[Any, bytes]] = {}
    for fn, body in bodies:
        seen.setdefault((id(fn), len(body) // 16), (fn, body))
    tried = 0
    for fn, body in seen.values():
        for _ in range(30):
            mutated = bytearray(body)
            for _ in range(rng.randint(1, 4)):
                if not mutated:
                    break
                at = rng.randrange(len(mutated))
                mutated[at] = rng.choice([rng.randrange(256), 0, 0x7F, 0x80, 0xFF])
            if rng.random() < 0.3:
                mutated = mutated[: rng.randrange(len(mutated) + 1)]
            data = bytes(mutated)
            tried += 1
            assert _outcome(fn, data) == _outcome(fn.reference, data), (fn.reference.__name__, data.hex())
            # the same through a bytearray, and decoding from an offset inside a larger buffer
            framed = bytearray(b"\x00" * 7 + data + b"\xff" * 5)
            got = _outcome(fn, framed, 7, 7 + len(data))
            want = _outcome(fn.reference, framed, 7, 7 + len(data))
            assert got == want, (fn.reference.__name__, data.hex())
    assert tried > 2500


def test_buffers_it_does_not_read_go_to_the_reference() -> None:
    fn = protocol.response_decoder(18, 3)
    body = bytes(64)
    n = fn.fallbacks
    assert _outcome(fn, memoryview(body)) == _outcome(fn.reference, memoryview(body))
    assert fn.fallbacks == n + 1


def test_every_layout_in_the_table_decodes_mutated_bodies_the_same() -> None:
    """Every request and response layout, not only those the captures hold: a body encoded from
    its default fields, then bytes changed, cut short or followed by others; the same fields or
    the same exception either way (and no crash)."""
    from decoder import message_codec as mc

    rng = random.Random(7)
    tried = 0
    for direction, get in (("request", protocol.request_decoder), ("response", protocol.response_decoder)):
        for api_key in protocol.API_NAMES:
            for version in range(0, 32):  # beyond any version the table has
                fn = get(api_key, version)
                if fn is None:
                    continue
                assert hasattr(fn, "reference"), (direction, api_key, version)
                body = mc.encode_message(
                    direction, api_key, version, mc.default_tree(direction, api_key, version)
                )
                assert _outcome(fn, body) == _outcome(fn.reference, body)
                for _ in range(20):
                    mutated = bytearray(body + bytes(rng.randrange(0, 40)))
                    for _ in range(rng.randint(1, 3)):
                        if mutated:
                            at = rng.randrange(len(mutated))
                            mutated[at] = rng.choice([rng.randrange(256), 0, 0x7F, 0x80, 0xFF, 1, 2])
                    data = bytes(
                        mutated[: rng.randrange(len(mutated) + 1)] if rng.random() < 0.2 else mutated
                    )
                    tried += 1
                    assert _outcome(fn, data) == _outcome(fn.reference, data), (
                        direction,
                        api_key,
                        version,
                        data.hex(),
                    )
    assert tried > 10_000
