"""Interactive visualizers (ipywidgets) over the calculators; the dashboard's tabs.

- ``base``: the ``Widget`` protocol every tab follows (``widget``, ``state``/``set_state``,
  ``figure``, ``table``, ``error``, ``on_update``) and ``ControlPanel``, the base class that
  implements it: controls -> one calculator call -> figure, numbers and an in-place error.
- ``memory.MemoryWidget``: training memory per GPU (``mlsys_nb.memory.estimate``).
- ``scaling.ScalingWidget``: compute-optimal model size and tokens (``mlsys_nb.scaling``, ``flops``).
- ``pipeline.PipelineWidget``: pipeline schedules and their bubbles (``mlsys_nb.pipeline``).

Widgets compute nothing themselves; each module loads ipywidgets and matplotlib when imported.
"""
