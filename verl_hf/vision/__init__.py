"""Vision-language inputs: what an image-bearing row carries through a round.

images.py     -- a row's images read from PIL images, paths, bytes or `datasets.Image` dicts, or refused naming
                 the row and column
inputs.py     -- each row's pixel inputs made once by the model's processor (`RowPixels`), joined per
                 micro-batch in row order (never sliced by row index)
positions.py  -- the training forward's position ids: the model's own 3-D rotary positions (Qwen2-VL family),
                 per row, wherever the padding is

The tiny Qwen2-VL the tests build: verl_hf/demo/tiny_vision.py. See it work: tests/test_vision_inputs.py.
"""
