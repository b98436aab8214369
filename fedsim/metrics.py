"""What the final global model gets right and wrong: per class, per client, and the confusion matrix.

A client *holds* a class when its partition has at least one training row of that class (real
rows; an augmenter's synthetic rows do not count). Its "own classes" accuracy is the global
model's test accuracy on the test rows of the classes it holds, its "missing classes" accuracy
the same on the classes it lacks: how much of what the federation learnt reaches a client that
never saw a class.

The convergence check of every run: a method whose validation accuracy still rises over its last
rounds is reported as not converged (more rounds would change its row, and a gain measured against
it may be a gain in training steps).
"""
from __future__ import annotations

import numpy as np
import torch

# Not converged: the least-squares slope of the validation accuracy over the last CONVERGENCE_WINDOW
# rounds exceeds CONVERGENCE_SLOPE (accuracy per round: 0.2 percentage points per round, +0.8 over the
# window). Chosen by measurement (docs/comparisons.md, "Convergence check").
CONVERGENCE_WINDOW = 5
CONVERGENCE_SLOPE = 0.002


def val_slope(val_accuracy) -> float | None:
    """The least-squares slope (accuracy per round) of the last CONVERGENCE_WINDOW values of
    ``val_accuracy`` (one per round); None with fewer rounds."""
    if len(val_accuracy) < CONVERGENCE_WINDOW:
        return None
    a = np.asarray(val_accuracy[-CONVERGENCE_WINDOW:], dtype=np.float64)
    r = np.arange(CONVERGENCE_WINDOW, dtype=np.float64) - (CONVERGENCE_WINDOW - 1) / 2
    return float((r * (a - a.mean())).sum() / (r * r).sum())


def convergence(val_accuracy) -> dict:
    """``val_slope`` and ``converged`` (the slope is at most CONVERGENCE_SLOPE) of one run; both
    None when it has fewer than CONVERGENCE_WINDOW rounds (not checked)."""
    slope = val_slope(val_accuracy)
    return {"val_slope": slope, "converged": None if slope is None else slope <= CONVERGENCE_SLOPE}


def confusion_matrix(pred: torch.Tensor, y: torch.Tensor, n_classes: int) -> torch.Tensor:
    """(C, C) int64 counts: row = true class, column = predicted class."""
    return torch.bincount(y.long() * n_classes + pred.long(), minlength=n_classes * n_classes).view(
        n_classes, n_classes).cpu()


def _accuracy(conf: torch.Tensor, classes) -> float | None:
    """Accuracy over the test rows of ``classes`` (None when they have none)."""
    idx = torch.as_tensor(sorted(classes), dtype=torch.long)
    n = int(conf[idx].sum()) if len(idx) else 0
    return None if n == 0 else float(conf[idx, idx].sum()) / n


@torch.no_grad()
def final_report(model, x_test: torch.Tensor, y_test: torch.Tensor, client_labels, n_classes: int) -> dict:
    """The final model's per-class accuracy (None for a class without test rows), its confusion
    matrix, and per client the classes it holds with its accuracy on them and on the rest;
    ``client_labels``: each client's training labels. Scalars for the summary: the worst class
    and the means over clients of the own / missing accuracies (clients without such test rows
    left out; None if no client has any)."""
    model.eval()
    pred = model(x_test)[0].argmax(1)
    conf = confusion_matrix(pred, y_test, n_classes)
    per_class = [_accuracy(conf, [c]) for c in range(n_classes)]
    clients = []
    for k, y in enumerate(client_labels):
        held = sorted(int(c) for c in torch.unique(y).tolist())
        lacked = sorted(set(range(n_classes)) - set(held))
        clients.append({"client": k, "classes": held, "own_accuracy": _accuracy(conf, held),
                        "missing_accuracy": _accuracy(conf, lacked)})

    def mean(key):
        vals = [c[key] for c in clients if c[key] is not None]
        return sum(vals) / len(vals) if vals else None

    present = [a for a in per_class if a is not None]
    return {"per_class": per_class, "confusion": conf.tolist(), "per_client": clients,
            "worst_class_accuracy": min(present) if present else None,
            "own_class_accuracy": mean("own_accuracy"), "missing_class_accuracy": mean("missing_accuracy")}


@torch.no_grad()
def evaluate(model, x, y, d=None, n_domains: int = 0) -> tuple[float, list[float]]:
    model.eval()
    pred = model(x)[0].argmax(1)
    correct = (pred == y).to(torch.float64)
    # None for a domain without test rows (its mean would be NaN)
    per_domain = [float(correct[d == k].mean()) if bool((d == k).any()) else None
                  for k in range(n_domains)] if d is not None else []
    return float(correct.mean()), per_domain


@torch.no_grad()
def accuracy(model, x, y) -> float:
    """The share of rows (x, y) the model classifies right (the validation rows' score)."""
    model.eval()
    return float((model(x)[0].argmax(1) == y).to(torch.float64).mean())
