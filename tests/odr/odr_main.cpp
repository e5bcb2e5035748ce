int odr_a();
int odr_b();
int main() { return odr_a() == odr_b() ? 0 : 1; }
