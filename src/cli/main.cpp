// Placeholder entry until the CLI lands (replaced by the `kiln info` work).
#include <cstdio>
int main() { std::puts("kiln"); return 0; }
