"""The width-scaling baselines: HeteroFL (Diao et al., 2021) and FjORD (Horvath et al.,
2021), two methods on one fixed architecture (``search_spaces.widths``); ``docs/baselines.md``.
"""
