"""The numerics of a step: the precision policies (:mod:`.precision`) and what they are built from.

- :mod:`.loss_scale`: static, dynamic and no-op loss scalers, all on the device;
- :mod:`.overflow`: gradient kinds (finite, inf, NaN) and the step's one cross-rank agreement;
- :mod:`.observers`, :mod:`.forensics`, :mod:`.underflow`: the step's optional observers (overflow evidence,
  fp16 underflow sampling);
- :mod:`.step_outcome`: a step's device tensors and their host reading;
- :mod:`.fp8`: fp8 quantisation, the emulated fp8 Linear and the torchao conversion.
"""
