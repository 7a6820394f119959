"""Which loaders are evaluation data: a loader is judged by its name when the
name says evaluation, and by its use otherwise. A loader named like training
data is evaluation data only when every use of it can be seen and evaluates:
each pass is a loop without gradients, in an evaluation function or with its
work under a per-batch `no_grad`, and its name reaches no call that might
train on it."""

from __future__ import annotations

from ddpcheck.model.evaluation import is_eval_loader, pass_without_gradients
from ddpcheck.model.flow import every_pass
from ddpcheck.model.values import held_loaders, loaders
from tests.semantics.helpers import build

HEAD = """
import torch
from torch.utils.data import DataLoader

def score(model, loader):
    out = []
    for x, y in loader:
        with torch.no_grad():
            out.append(model(x))
    return out

def fit(model, loader, opt):
    for x, y in loader:
        with torch.no_grad():
            x = x.half()
        model(x).sum().backward()
        opt.step()
"""


def _judged(tail: str) -> dict[str, bool]:
    model = build(HEAD + tail)
    return {l.key: is_eval_loader(model, l) for l in loaders(model)}


def test_a_loader_named_like_training_data_but_only_scored_is_evaluation_data():
    assert _judged("target_train_loader = DataLoader(ds)\nscore(net, target_train_loader)\n") == \
        {"target_train_loader": True}


def test_a_training_loop_over_it_keeps_it_training_data():
    assert _judged("train_loader = DataLoader(ds)\nfit(net, train_loader, opt)\nscore(net, train_loader)\n") == \
        {"train_loader": False}


def test_a_stream_drained_with_next_keeps_it_training_data():
    assert _judged("train_loader = DataLoader(ds)\nscore(net, train_loader)\nit = iter(train_loader)\n"
                   "for step in range(9):\n    batch = next(it)\n") == {"train_loader": False}


def test_a_library_call_handed_the_name_keeps_it_training_data():
    assert _judged("import engine_lib\ntrain_loader = DataLoader(ds)\nengine_lib.run(train_loader)\n"
                   "score(net, train_loader)\nn = len(train_loader)\n") == {"train_loader": False}


def test_len_of_the_loader_is_not_a_use_that_trains():
    assert _judged("train_loader = DataLoader(ds)\nn = len(train_loader)\nscore(net, train_loader)\n") == \
        {"train_loader": True}


def test_an_unnamed_loader_whose_loop_works_under_no_grad_without_backward_is_evaluation_data():
    assert _judged("a = DataLoader(ds)\nscore(net, a)\nb = DataLoader(ds)\nfit(net, b, opt)\n") == \
        {"a": True, "b": False}


def test_a_held_loader_drained_by_a_stream_helper_stays_training_data():
    model = build(HEAD + """
def make(ds):
    return DataLoader(ds)

def endless(loader):
    it = loader.__iter__()
    while True:
        try:
            yield it.__next__()
        except StopIteration:
            it = loader.__iter__()

train_loader = make(ds)
stream = endless(train_loader)
score(net, train_loader)
""")
    assert {l.key: is_eval_loader(model, l) for l in held_loaders(model)} == {"train_loader": False}


def test_a_loop_that_runs_backward_keeps_training_data_whatever_its_function_is_called():
    assert _judged("""
def _eval_train(model, loader, opt):
    for x, y in loader:
        model(x).sum().backward()
        opt.step()

train_loader = DataLoader(ds)
_eval_train(net, train_loader, opt)
""") == {"train_loader": False}


_ONE_CALL_DOWN = """
def train_step(model, batch):
    loss = model(batch).sum()
    loss.backward()
    return loss

def epoch_with_ema(model, ema, loader, step=train_step):
    for batch in loader:
        train_step(model, batch)
        with torch.no_grad():
            ema.update(model)

def epoch_with_scaler(model, teacher, loader, optimizer, loss_scaler):
    for x, y in loader:
        with torch.no_grad():
            soft = teacher(x)
        loss = (model(x) - soft).pow(2).mean()
        loss_scaler(loss, optimizer)

def epoch_with_made_optimizer(model, teacher, loader):
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        with torch.no_grad():
            soft = teacher(x)
        apply_update(model(x) - soft, sgd)
"""


def test_a_training_step_one_call_down_keeps_the_loop_training():
    # the no_grad block is an EMA update; backward() runs in train_step
    assert _judged(_ONE_CALL_DOWN + "data_loader = DataLoader(ds)\nepoch_with_ema(net, ema, data_loader)\n") == \
        {"data_loader": False}


def test_a_call_handed_an_optimizer_or_a_scaler_trains():
    # `loss_scaler(loss, optimizer)` (a library's step helper), an optimizer torch made
    assert _judged(_ONE_CALL_DOWN + "data_loader = DataLoader(ds)\n"
                   "epoch_with_scaler(net, teacher, data_loader, opt, scaler)\n") == {"data_loader": False}
    assert _judged(_ONE_CALL_DOWN + "data_loader = DataLoader(ds)\n"
                   "epoch_with_made_optimizer(net, teacher, data_loader)\n") == {"data_loader": False}


def test_a_scoring_loop_that_only_calls_plain_helpers_still_evaluates():
    assert _judged(_ONE_CALL_DOWN + "def metric(a, b):\n    return (a == b).float().mean()\n"
                   "def rate(model, loader):\n    for x, y in loader:\n        with torch.no_grad():\n"
                   "            p = model(x)\n        metric(p, y)\n"
                   "target_train_loader = DataLoader(ds)\nrate(net, target_train_loader)\n") == \
        {"target_train_loader": True}


def test_a_pass_with_autograd_off_on_the_way_down_is_no_training_pass():
    code = HEAD + (
        "def loader_loss(loader, model, n):\n"
        "    for i, (x, y) in enumerate(loader):\n"
        "        if i >= n:\n            break\n        model(x)\n"
        "def estimate(model, loader):\n"
        "    with torch.no_grad():\n        return loader_loss(loader, model, 5)\n"
        "def train(model, loader, opt):\n"
        "    for epoch in range(3):\n"
        "        for x, y in loader:\n"
        "            model(x).sum().backward()\n            opt.step()\n"
        "            estimate(model, loader)\n"
        "        fit(model, loader, opt)\n")
    model = build(code)
    judged = {(p.loop.ctx.function.name, tuple(c.func for c in p.via)): pass_without_gradients(p)
              for fn, p in every_pass(model) if fn is not None and fn.name == "train" and p.loop is not None}
    assert judged[("loader_loss", ("estimate", "loader_loss"))] is True    # no_grad around the call
    assert judged[("train", ())] is False                                 # the training loop itself
    assert judged[("fit", ("fit",))] is False     # a loop whose no_grad block is only a cast, and trains
