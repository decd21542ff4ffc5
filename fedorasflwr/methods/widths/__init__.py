"""The width-scaling baselines: HeteroFL (Diao et al., 2021) and FjORD (Horvath et al.,
2021), two methods on one fixed architecture (``search_spaces.widths``' ConvNet, or a
width-scalable model of the user's: ``model``); ``docs/baselines.md``.
"""
