"""Interactive visualizers (ipywidgets) over the calculators; the dashboard's tabs.

- ``base``: the ``Widget`` protocol every tab follows (``widget``, ``state``/``set_state``,
  ``figure``, ``table``, ``error``, ``on_update``) and ``ControlPanel``, the base class that
  implements it: controls -> one calculator call -> figure, numbers and an in-place error.
- ``memory.MemoryWidget``: training memory per GPU (``mlsys_nb.memory.estimate``).
- ``scaling.ScalingWidget``: compute-optimal model size and tokens (``mlsys_nb.scaling``, ``flops``).
- ``pipeline.PipelineWidget``: pipeline schedules and their bubbles (``mlsys_nb.pipeline``).
- ``inference.InferenceWidget``: KV cache, concurrency and the roofline (``mlsys_nb.inference``).
- ``planner.PlannerWidget``: the 5D layout search (``mlsys_nb.planner``).
- ``rlhf.RLHFSizingWidget``: co-located vs split RLHF layouts for real sizes (``mlsys_nb.rl.sizing``).
- ``practice.PracticeWidget``: interview practice over ``mlsys_nb.quiz``.

Widgets compute nothing themselves; each module loads ipywidgets and matplotlib when imported.
"""
