"""Inter-session Listwise Preference Optimization (paper Sec. 2.3, Eq. 5-6).

- :mod:`.config`: :class:`LipoConfig`, every LiPO setting with its default, written once.
- :mod:`.batch`: the batch sampler (numpy; the web side imports it).
- :mod:`.loss`: the loss (torch; only the trainer imports it).

This file imports nothing, so importing the sampler or the config never loads torch.
"""
