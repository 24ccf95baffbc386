"""Vision-language inputs: what an image-bearing row carries through a round.

images.py     -- a row's images read from PIL images, paths, bytes or `datasets.Image` dicts, or refused naming
                 the row and column
inputs.py     -- each row's pixel inputs made once by the model's processor (`RowPixels`), joined per
                 micro-batch in row order (never sliced by row index)
positions.py  -- the training forward's position ids: the model's own 3-D rotary positions (Qwen2-VL family),
                 per row, wherever the padding is
prompts.py    -- a dataset row's chat prompt and images made into expanded ids and pixels by the processor
answers.py    -- the images an environment or a tool answers with in a multi-turn conversation, expanded and
                 counted against their placeholders
setup.py      -- VerlTrainer's checks before any model loads, the model class, the frozen tower
without_torchvision.py -- the Qwen2-VL and Qwen3-VL families' processors without their video part

The tiny Qwen2-VL the tests build: verl_hf/demo/tiny_vision.py. See it work: tests/test_vision_inputs.py.
"""
