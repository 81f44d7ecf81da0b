"""Matrix multiplication in pure Python, three ways (the by-hand text, exercise B).

All three compute C = A @ B for A of shape (M, K) and B of shape (K, N), given as lists of
rows, and return C as a list of rows. They do exactly the same 2*M*N*K floating-point
operations; only the order of the loops differs, and with it how much work the interpreter
does per multiply-add.

- ``matmul_ijk``: the definition. C[i][j] is the dot product of row i of A with column j
  of B. The inner loop indexes B[p][j], a different row list every step.
- ``matmul_ikj``: the i, p, j order. Row i of C is built as a running sum of rows of B,
  each scaled by one element of A. The inner loop walks one row of B and one row of C, and
  A[i][p] is looked up once per row instead of once per multiply.
- ``matmul_outer``: the sum of outer products, C = sum over p of A[:, p] (x) B[p, :]. Each p
  is a rank-1 update of the whole of C, which is how tensor cores see a matmul.

These are for reading and for measuring what loop order does to an interpreter; the harness
refuses sizes that would take hours.
"""


def matmul_ijk(a, b):
    m, k, n = len(a), len(b), len(b[0]) if b else 0
    c = [[0.0] * n for _ in range(m)]
    for i in range(m):
        for j in range(n):
            total = 0.0
            for p in range(k):
                total += a[i][p] * b[p][j]
            c[i][j] = total
    return c


def matmul_ikj(a, b):
    m, k, n = len(a), len(b), len(b[0]) if b else 0
    c = [[0.0] * n for _ in range(m)]
    for i in range(m):
        c_row = c[i]
        for p in range(k):
            a_ip = a[i][p]
            b_row = b[p]
            for j in range(n):
                c_row[j] += a_ip * b_row[j]
    return c


def matmul_outer(a, b):
    m, k, n = len(a), len(b), len(b[0]) if b else 0
    c = [[0.0] * n for _ in range(m)]
    for p in range(k):
        a_col = [a[i][p] for i in range(m)]  # column p of A
        b_row = b[p]  # row p of B
        for i in range(m):
            a_ip = a_col[i]
            c_row = c[i]
            for j in range(n):
                c_row[j] += a_ip * b_row[j]
    return c
