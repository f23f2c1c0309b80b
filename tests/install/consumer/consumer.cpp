// consumer.cpp — the C++ engine's view of the INSTALLED libmoe_client: moe_client.h as a
// C++17 header, one FORWARD of two experts equal to the sum of each expert's FORWARD.
// Usage: consumer SOCKET. Exit 0 on success.
#include <moe_client.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

namespace
{

struct Client {
	moe_client *c = nullptr;
	~Client()
	{
		moe_close(c);
	}
};

int die(const char *what, int rc, const moe_client *c)
{
	std::fprintf(stderr, "consumer-cxx: %s: %s: %s\n", what, moe_strerror(rc),
	             c ? moe_last_error(c) : moe_connect_error());
	return 1;
}

int forward(moe_client *c, const moe_slot &s, int32_t layer, const std::vector<float> &x,
            const int32_t (&ids)[2], const float (&w)[2], std::vector<float> &out)
{
	std::memcpy(s.input, x.data(), x.size() * sizeof(float));
	std::memcpy(s.expert_ids, ids, sizeof(ids));
	std::memcpy(s.expert_weights, w, sizeof(w));
	moe_completion done{};
	int rc = moe_forward(c, &s, layer, 1, 2, 0, MOE_DTYPE_F32, MOE_DTYPE_F32, 0, &done, 10000);
	if (rc == MOE_OK)
		std::memcpy(out.data(), s.output, out.size() * sizeof(float));
	return rc;
}

} // namespace

int main(int argc, char **argv)
{
	if (argc != 2) {
		std::fprintf(stderr, "usage: consumer SOCKET\n");
		return 2;
	}
	moe_connect_opts o{};
	o.socket_path = argv[1];
	o.max_tokens = 4;
	o.client_name = "consumer-cxx";
	Client cl;
	int rc = moe_connect(&o, &cl.c);
	if (rc != MOE_OK)
		return die("connect", rc, nullptr);
	const moe_info_t *inf = moe_info(cl.c); // C++ spelling: moe_info is also the function
	int32_t layer = -1;
	if ((rc = moe_model_layers(cl.c, &layer, 1)) < 1)
		return die("moe_model_layers", rc, cl.c);
	const uint32_t hidden = inf->hidden;
	std::vector<float> x(hidden), both(hidden), a(hidden), b(hidden);
	for (uint32_t i = 0; i < hidden; i++)
		x[i] = std::sin(0.37f * static_cast<float>(i));
	moe_slot s{};
	if ((rc = moe_slot_acquire(cl.c, &s)) != MOE_OK)
		return die("acquire", rc, cl.c);
	const int32_t ids2[2] = {0, 1}, ids_a[2] = {0, -1}, ids_b[2] = {1, -1};
	const float w2[2] = {0.25f, 0.75f}, w_a[2] = {0.25f, 0.0f}, w_b[2] = {0.75f, 0.0f};
	if ((rc = forward(cl.c, s, layer, x, ids2, w2, both)) != MOE_OK ||
	    (rc = forward(cl.c, s, layer, x, ids_a, w_a, a)) != MOE_OK ||
	    (rc = forward(cl.c, s, layer, x, ids_b, w_b, b)) != MOE_OK)
		return die("FORWARD", rc, cl.c);
	double err = 0, norm = 0;
	for (uint32_t i = 0; i < hidden; i++) {
		err = std::max(err, std::fabs(double(both[i]) - (double(a[i]) + double(b[i]))));
		norm = std::max(norm, std::fabs(double(both[i])));
	}
	moe_slot_release(cl.c, s.index);
	if (!(norm > 0) || err > 1e-5 * norm + 1e-6) {
		std::fprintf(stderr, "consumer-cxx: two experts %g from the sum of each\n", err);
		return 1;
	}
	std::printf("consumer-cxx: FORWARD of layer %d ok (hidden %u, max |out| %.3g)\n", layer,
	            hidden, norm);
	return 0;
}
