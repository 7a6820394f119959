"""``ddpcheck preflight``: a tiny real distributed run before the real job.

It starts one worker per GPU with torch's own elastic launcher, checks the
process group and its collectives, measures the memory of one training step of
the user's model at batch 1 and 2, and does the data-set arithmetic
(DistributedSampler padding, last batches, effective batch, lr scaling).

Importing this package (or :mod:`ddpcheck.preflight.command`) never imports
torch: ``ddpcheck lint`` must stay torch-free. The modules that need torch
(``launch``, ``worker``, ``collectives``, ``memory``) import it themselves and
are only imported once the preflight actually runs.
"""
