"""An augmenter's exchange over Flower messages, for any Flower app: fedsim's own ServerApp and
ClientApp use it, and so can yours (examples/flower_exchange/app.py: GGEUR added to Flower's own
FedAvg strategy in a few lines, without fedsim's runner).

Server side, ``serve_exchange``: for each of the augmenter's steps (``Augmenter.steps``), a
``query.upload`` message to each client taking part (in batches, so the server holds one batch of
replies at a time), each reply decoded (``codec.take``: every container checked by its
``from_bytes``) and checked by the augmenter's ``accept`` (a failing one is reported and left
out), the augmenter's ``aggregate``, then a ``query.download`` with each client's part.

Client side, ``answer``: a ``query.upload`` / ``query.download`` message handled by the client's
augmenter (``upload`` / ``download``), with what the client keeps between messages
(``client_state``) in its Flower ``context.state``; ``client_augmenter`` gives the same augmenter
back for training (``augment``).
"""
from __future__ import annotations

from typing import Callable

from flwr.app import ConfigRecord, Context, Message, RecordDict

from . import codec

UPLOAD, DOWNLOAD = "query.upload", "query.download"
# clients per batch of exchange messages: the server holds one batch's replies (GGEUR: C x D x D
# covariances each) at a time, and keeps only what the augmenter's accept keeps of them
EXCHANGE_BATCH = 32


def _batches(cids: list[int], size: int) -> list[list[int]]:
    return [cids[lo:lo + size] for lo in range(0, len(cids), size)]


def serve_exchange(augmenter, round: int | None, clients: list[int],
                   send: Callable[[str, dict[int, RecordDict]], dict[int, RecordDict]], *, device="cpu",
                   reject: Callable[[int, str, Exception], None] | None = None, batch: int | None = None) -> None:
    """Run the augmenter's exchange of ``round`` (None: the one-time set-up) with ``clients`` (client
    ids) over messages. ``send(kind, {cid: records})`` sends one message of type ``kind`` to each
    cid and returns the replies' contents by cid (a client without a usable reply is left out);
    ``reject(cid, what, exc)`` hears about an upload that failed its checks (default: re-raise).
    The augmenter (the server's: ``bind`` called) keeps what it aggregated (``setup_bytes``,
    ``round_bytes``, ``privacy``)."""
    size = batch or EXCHANGE_BATCH
    for step, cids in augmenter.steps(round, list(clients)):
        uploads, rejected = {}, []
        for part in _batches(list(cids), size):  # one batch's replies at a time; what stays is what accept keeps
            replies = send(UPLOAD, {c: RecordDict({"exchange": codec.exchange(step, round)}) for c in part})
            if not isinstance(replies, dict):
                raise TypeError(f"send(kind, contents) must return the replies' contents by client id (a dict), "
                                f"got {type(replies).__name__}")
            for cid in part:
                if cid not in replies:
                    continue
                try:
                    payload = codec.take(replies[cid], "payload", source="the upload", device=device)
                    if payload is not None:
                        try:
                            uploads[cid] = augmenter.accept(step, cid, payload, round=round)
                        except KeyError as exc:
                            raise ValueError(f"it has no entry {exc.args[0]!r} (it sent {sorted(payload)})") from None
                except (ValueError, TypeError) as exc:
                    if reject is None:
                        raise
                    rejected.append(cid)
                    reject(cid, f"{step} upload" + ("" if round is None else f" of round {round + 1}"), exc)
            del replies
        downloads = augmenter.aggregate(step, uploads, round=round, clients=list(cids), rejected=rejected)
        del uploads
        blobs: dict = {}  # a container sent to many clients is serialised once
        for part in _batches(sorted(downloads), size):
            contents = {}
            for cid in part:
                contents[cid] = RecordDict({"exchange": codec.exchange(step, round)})
                codec.put(contents[cid], "payload", downloads[cid], blobs=blobs)
            send(DOWNLOAD, contents)


def client_augmenter(augmenter, cid: int, data, context: Context, key: str = "aug"):
    """``augmenter`` (a fresh, bound one) with what this client kept from earlier messages."""
    augmenter.load_client_state(cid, codec.take(context.state, key, source="this client's kept exchange state",
                                                 device=data.x.device))
    return augmenter


def answer(msg: Message, context: Context, augmenter, cid: int, data, key: str = "aug") -> Message:
    """The reply of client ``cid`` (rows ``data``: an augmenters.ClientData) to a ``query.upload`` or
    ``query.download`` message: its augmenter's upload, or its download taken and acknowledged;
    what it keeps goes to ``context.state[key...]``."""
    step, round = codec.read_exchange(msg.content)
    if step not in augmenter.step_names:
        raise ValueError(f"augmenter {augmenter.name!r} has no exchange step {step!r} (its steps: "
                         f"{list(augmenter.step_names)}): the server runs another augmenter or version")
    aug = client_augmenter(augmenter, cid, data, context, key)
    reply = RecordDict()
    if msg.metadata.message_type == UPLOAD:
        codec.put(reply, "payload", aug.upload(step, cid, data, round=round))
    else:
        payload = codec.take(msg.content, "payload", source=f"the server's {step} download", device=data.x.device)
        aug.download(step, cid, payload or {}, round=round)
        reply["ack"] = ConfigRecord({"ok": True})
    codec.put(context.state, key, aug.client_state(cid, data))
    return Message(reply, reply_to=msg)
