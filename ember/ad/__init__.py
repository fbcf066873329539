"""ember.ad: derivatives and batching of NumericalFunctions, each returning a NumericalFunction.

Dense (ad/transforms.py): vjp, jvp, gradient, jacobian, hessian, vmap. Sparse (ad/sparse.py): spjacobian and
sphessian, which find the pattern of nonzeros from the graph, color it, and evaluate one direction per color.
Loops (ember/scan.py): scan and fold, whose derivatives and batches are loops too.
"""

from ember.ad.sparse import SparseFunction, sphessian, spjacobian
from ember.ad.transforms import gradient, hessian, jacobian, jvp, vjp, vmap
from ember.scan import fold, scan

__all__ = ["vjp", "jvp", "gradient", "jacobian", "hessian", "vmap", "spjacobian", "sphessian", "SparseFunction", "scan",
           "fold"]
