"""Interactive visualizers (ipywidgets) over the calculators; the dashboard's tabs.

- ``base``: the ``Widget`` protocol every tab follows (``widget``, ``state``/``set_state``,
  ``figure``, ``table``, ``error``, ``on_update``), ``Panel``, which implements it, and
  ``ControlPanel``, the one template of a calculator widget: it declares its controls, its figure
  and ``compute`` -> ``rows`` -> ``headline`` -> ``draw``; the base runs them and shows bad input
  as a message in place of the figure.
- ``memory.MemoryWidget``: training memory per GPU (``mlsys_nb.memory.estimate``).
- ``scaling.ScalingWidget``: compute-optimal model size and tokens (``mlsys_nb.scaling``, ``flops``).
- ``pipeline.PipelineWidget``: pipeline schedules and their bubbles (``mlsys_nb.pipeline``).
- ``inference.InferenceWidget``: KV cache, concurrency and the roofline (``mlsys_nb.inference``).
- ``planner.PlannerWidget``: the 5D layout search (``mlsys_nb.planner``).
- ``rlhf.RLHFSizingWidget``: co-located vs split RLHF layouts for real sizes (``mlsys_nb.rl.sizing``).
- ``practice.PracticeWidget``: interview practice over ``mlsys_nb.quiz`` (a ``Panel``: its
  actions, not one calculator call, drive its redraws).

Widgets compute nothing themselves; each module loads ipywidgets and matplotlib when imported.
"""
