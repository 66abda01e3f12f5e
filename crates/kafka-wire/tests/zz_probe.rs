use exactly_kafka_wire::KafkaConnection;
use exactly_kafka_wire::kafka_protocol::messages::*;
use exactly_kafka_wire::kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use exactly_kafka_wire::kafka_protocol::protocol::StrBytes;

#[tokio::test]
async fn probe() {
    for (t, name) in [(4i8, "111"), (4, ""), (2, "x")] {
        let mut conn = KafkaConnection::connect("127.0.0.1:19092").await.unwrap();
        let req = DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default().with_resource_type(t).with_resource_name(StrBytes::from_static_str(name))]);
        match conn.request(4, &req).await {
            Ok(r) => for res in r.results { println!("{t}/{name}: err {} {:?} {} configs: {:?}", res.error_code, res.error_message, res.configs.len(), res.configs.iter().map(|c| format!("{}={:?}", c.name.as_str(), c.value)).collect::<Vec<_>>()); },
            Err(e) => println!("{t}/{name}: {e}"),
        }
    }
}
