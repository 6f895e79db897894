"""Observability: TensorBoard writer, GPU sampler, step timer, progress, profiler, health.

Import-light on purpose: nothing here is imported until a submodule is (``from
muongen.monitor.tensorboard import TensorBoardLogger``), so ``muongen inspect`` and the
grid's POST script never pay for TensorBoard, NVML or tqdm.

- :mod:`~muongen.monitor.tensorboard`: ``TensorBoardLogger``, ``read_scalars``, ``scrub_secrets``
- :mod:`~muongen.monitor.gpu`: ``GpuMonitor`` (NVML sampler thread + CUDA allocator stats)
- :mod:`~muongen.monitor.timing`: ``StepTimer`` (time split of a training step)
- :mod:`~muongen.monitor.progress`: ``Progress`` (tqdm bar on a terminal, plain lines otherwise)
- :mod:`~muongen.monitor.profiler`: ``profile`` (top operators + Chrome trace)
- :mod:`~muongen.monitor.health`: ``classify``, ``MovingAverage``
- :mod:`~muongen.monitor.tb_merge`: ``muongen tb-merge``
"""
