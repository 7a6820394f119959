"""``ddpcheck preflight -- SCRIPT ...``: preflight the user's own training script.

The script runs unchanged on N ranks started the way torchrun starts them
(:mod:`.launch`); inside each rank, documented and reversible interception
(:mod:`.observe`, :mod:`.scratch`) records what the script does -- DataLoaders,
set_epoch, DDP construction, collectives, checkpoint writes, optimizer steps,
memory -- while :mod:`.steer` bounds the run (last batch first, a few steps,
the next epoch reached, every rank stopped together). :mod:`.judge` turns the
ranks' facts into findings linked to the lint rules that predict them, and
:mod:`.report` prints them. Plain data crosses between the parts:
:mod:`.facts`.

Nothing here is imported by ``ddpcheck lint``; torch is imported lazily.
"""
