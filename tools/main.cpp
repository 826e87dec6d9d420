#include <cstdio>
int main() { std::puts("kiln: under construction"); return 0; }
