"""The domain models SGLang's DSpark behaviour is written in: numpy and the standard library, no torch.

``sps`` (cost tables), ``sts`` (temperature tables), ``temperature`` (the one rule for a request-step's
sampling temperature, applied by the store on write), ``scheduler`` (the verify budget and allocation),
``workloads`` and ``corpus`` (prompt sets), ``chat`` (the chat layout) and ``locations`` (where models,
cost profiles and workloads are found). Why a package of its own: ``ingest``, ``estimators``, ``live`` and
the CLI's name checks read these models, and the torch engine (``acceptscope.engine``) builds on them, so
they sit below both and neither reaches into the other.
"""
