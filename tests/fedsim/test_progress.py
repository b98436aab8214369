"""fedsim's progress helper: a bounded number of plain lines when the stream is not a terminal."""
import io

from fedsim._progress import progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_stream_gets_bounded_plain_lines():
    out = io.StringIO()
    with progress_bar(total=1000, desc="extract", unit="item", stream=out) as bar:
        for _ in range(1000):
            bar.update()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert 2 <= len(lines) <= 12, lines  # start, every 10%, end
    assert lines[0].startswith("extract: 0/1000 items (0%)")
    assert lines[-1].startswith("extract: 1000/1000 items (100%)")


def test_iterable_unknown_length_and_postfix():
    out = io.StringIO()
    seen = []
    bar = progress_bar((i for i in range(1000)), desc="rounds", unit="round", stream=out)
    for i in bar:
        seen.append(i)
        bar.set_postfix(acc=f"{i / 1000:.3f}")
    bar.close()  # closing twice writes nothing more
    lines = out.getvalue().splitlines()
    assert seen == list(range(1000))
    assert len(lines) == 2, lines  # unknown total: start and end (the run took < interval)
    assert lines[-1].startswith("rounds: 1000 rounds") and lines[-1].endswith("acc=0.999")


def test_resumed_range_and_nested_and_disabled():
    out = io.StringIO()
    outer = progress_bar(range(5, 30), initial=5, total=30, desc="FedAvg seed 0", unit="round", stream=out)
    for _ in outer:
        for _ in progress_bar(range(10), desc="clients", unit="client", nested=True, stream=out):
            pass
    lines = out.getvalue().splitlines()
    assert not any("clients" in line for line in lines)
    assert lines[0].startswith("FedAvg seed 0: 5/30") and lines[-1].startswith("FedAvg seed 0: 30/30")
    assert len(lines) <= 12
    quiet = io.StringIO()
    assert list(progress_bar(range(3), stream=quiet, enabled=False)) == [0, 1, 2]
    assert quiet.getvalue() == ""


def test_terminal_gets_tqdm():
    term = _Terminal()
    bar = progress_bar(range(3), desc="demo", stream=term)
    assert type(bar).__name__ == "tqdm"
    assert list(bar) == [0, 1, 2]
