#include <cstdio>
int main() { std::puts("libreyolo " LIBREYOLO_VERSION); return 0; }
